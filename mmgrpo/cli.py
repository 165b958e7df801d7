"""``mmgrpo`` command line: ``mmgrpo train [--config FILE] [key=value ...]``.

``mmgrpo train --help`` lists every option (dotted name, type, default, help) without importing torch.
"""
from __future__ import annotations

import sys
from typing import Sequence

USAGE = """usage: mmgrpo <command> [options]

commands:
  train      GRPO fine-tuning of a Qwen2/2.5/3-VL policy (mmgrpo train --help lists every option)
  make-tiny  write a tiny random Qwen-VL checkpoint for smoke runs: mmgrpo make-tiny DIR [qwen2_5_vl|qwen2_vl|qwen3_vl]
"""


EXIT_CODES = ("Exit codes: 0 done; 3 stopped by a fault policy (run.max_consecutive_skips, reward.on_failure=stop), "
              "after writing a checkpoint; 4 interrupted by SIGTERM / SIGINT (preemption, Ctrl-C): the current step "
              "was finished or discarded, a checkpoint written, resume with run.resume_from=auto (a second signal "
              "1 s or more later aborts at once: the last complete checkpoint is kept); 130 Ctrl-C before training "
              "started.")


def train_main(argv: Sequence[str]) -> int:
    from mmgrpo.config import TrainConfig
    from mmgrpo.utils.config import parse_config_cli

    cfg = parse_config_cli(TrainConfig, argv, prog="mmgrpo train",
                           description="GRPO / TempSamp-R1 / T-GRPO / Reg-GRPO / TW-GRPO for Qwen-VL policies. "
                                       "Options: defaults < --config YAML < key=value overrides. " + EXIT_CODES)
    from mmgrpo.train.faults import TrainingStopped
    from mmgrpo.utils.signals import EXIT_INTERRUPTED, EXIT_SIGINT_EARLY, EXIT_STOPPED, TrainingInterrupted

    try:
        from mmgrpo.train.trainer import GRPOTrainer

        GRPOTrainer(cfg).train()
    except TrainingStopped as e:  # a configured fault policy stopped the run after writing a checkpoint
        print(f"mmgrpo train: {e}", file=sys.stderr)
        return EXIT_STOPPED
    except TrainingInterrupted as e:  # SIGTERM / SIGINT: stopped at a step boundary after writing a checkpoint
        print(f"mmgrpo train: {e}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:  # Ctrl-C before the training loop started: no traceback, nothing to save yet
        print("mmgrpo train: interrupted before training started (no checkpoint written)", file=sys.stderr)
        return EXIT_SIGINT_EARLY
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        return train_main(rest)
    if cmd == "make-tiny":
        if not rest:
            print("usage: mmgrpo make-tiny DIR [family]", file=sys.stderr)
            return 2
        from mmgrpo.models.tiny import save_tiny_model

        print(save_tiny_model(rest[0], rest[1] if len(rest) > 1 else "qwen2_5_vl"))
        return 0
    print(f"unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
