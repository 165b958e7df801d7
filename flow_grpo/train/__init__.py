"""The flow-matching GRPO recipe: the loop (``trainer``: :class:`~flow_grpo.train.trainer.FlowGRPOTrainer` and its
``train``) and the stages of one epoch (``steps``). Everything else of ``flow_grpo`` is the library the recipe calls
with explicit arguments (sampler, scoring, checkpoints, evaluation, epoch metrics, data); the methods are modules of
``flow_grpo.methods``. Nothing heavy is imported here."""
