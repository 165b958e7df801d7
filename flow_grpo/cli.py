"""``flow_grpo`` command line: ``flow_grpo train [--config cfg.yaml] [key=value ...]``.

``flow_grpo train --help`` lists every option (dotted name, type, default, help). Heavy libraries are imported only
when training starts.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

_DESCRIPTION = """GRPO for flow-matching text-to-image models (SD3 / FLUX) with exact per-step SDE log-probs.

Methods are presets (method=flow|dance|fast|mix|tp_grpo|g2rpo) over one trainer; every preset value can be
overridden. Examples:
  flow_grpo train model.tiny=sd3 method=fast data.prompts='[a cat, a dog]' run.num_epochs=2
  flow_grpo train --config my.yaml reward.weights='{pickscore: 1.0, ocr: 0.5}' reward.mode=per_reward
  accelerate launch --config_file scripts/accelerate_configs/multi_gpu.yaml --num_processes 8 \\
      -m flow_grpo.cli train --config my.yaml model.pipeline_dir=/ckpt/sd3.5m
  accelerate launch --config_file scripts/accelerate_configs/fsdp.yaml -m flow_grpo.cli train \\
      model.lora.enabled=false ...      (full fine-tune; sample.credit must be outcome)
Precedence: defaults < method preset < YAML < key=value.

Processes: the transformer, optimizer and LR schedule go through accelerator.prepare (DDP / FSDP / DeepSpeed per the
accelerate config); a launch whose process count accelerate does not honour is refused. Only CPU runs were verified
here (2 processes, gloo: DDP, and FSDP2 forced on CPU); GPU FSDP1 / DeepSpeed follow the standard accelerate path
untested. Faults: non-finite rewards drop their samples (reward.nan_policy), failing reward calls are retried then
dropped or stop the run (reward.retries/timeout/on_failure), non-finite advantages/loss/gradients skip the optimizer
step and optim.max_consecutive_skips in a row write <output_dir>/halted and stop. Resume: run.resume_from=auto.

Exit codes: 0 done; 3 stopped after optim.max_consecutive_skips skipped steps (state written to <output_dir>/halted);
4 interrupted by SIGTERM / SIGINT (preemption, Ctrl-C): the epoch was finished (or, still sampling, discarded), a
checkpoint written on every process, resume with run.resume_from=auto (a second signal 1 s or more later aborts at
once: the last complete checkpoint is kept); 130 Ctrl-C before training started."""


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: flow_grpo train [--config FILE] [--print-config] [key=value ...]\n\n" + _DESCRIPTION)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd != "train":
        print(f"unknown command {cmd!r}; available: train", file=sys.stderr)
        return 2
    from mmgrpo.utils.config import config_argparser, config_to_yaml

    from .config import TrainConfig, load_train_config

    parser = config_argparser(TrainConfig, prog="flow_grpo train", description=_DESCRIPTION)
    for action in parser._actions:  # the shared parser's example names keys of another config
        if action.dest == "overrides":
            action.help = "config overrides, e.g. optim.lr=1e-4 model.lora.rank=8 run.num_epochs=50"
    args = parser.parse_args(rest)
    try:
        cfg = load_train_config(args.config, args.overrides)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    if args.print_config:
        sys.stdout.write(config_to_yaml(cfg))
        return 0
    from mmgrpo.utils.signals import EXIT_INTERRUPTED, EXIT_SIGINT_EARLY, EXIT_STOPPED, TrainingInterrupted

    try:
        from .trainer import TrainingHalted, train_from_config

        train_from_config(cfg)
    except TrainingHalted as exc:  # non-finite steps in a row: the state was written first
        print(f"flow_grpo train: {exc}", file=sys.stderr)
        return EXIT_STOPPED
    except TrainingInterrupted as exc:  # SIGTERM / SIGINT: stopped at an epoch boundary after writing a checkpoint
        print(f"flow_grpo train: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # Ctrl-C before the training loop started: no traceback, nothing to save yet
        print("flow_grpo train: interrupted before training started (no checkpoint written)", file=sys.stderr)
        return EXIT_SIGINT_EARLY
    return 0


if __name__ == "__main__":
    sys.exit(main())
