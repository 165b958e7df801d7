"""The VLM GRPO trainer (``trainer``), the sample -> prompt glue (``task``) and the pure data-selection criteria
(``selection``); the methods themselves are modules of ``mmgrpo.vlm.methods``.  Nothing heavy is imported here."""
