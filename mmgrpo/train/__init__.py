"""The VLM GRPO trainer (``trainer``), its method terms (``methods``), data selection (``selection``) and the
sample -> prompt glue (``task``).  Nothing heavy is imported here."""
