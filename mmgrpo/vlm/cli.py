"""``mmgrpo`` command line: ``mmgrpo train [--config FILE] [key=value ...]``.

``mmgrpo train --help`` lists every option (dotted name, type, default, help) without importing torch.
"""
from __future__ import annotations

import sys
from typing import Sequence

from mmgrpo.vlm.models.adapters import ADAPTERS, unknown_family  # no torch import

USAGE = f"""usage: mmgrpo <command> [options]

commands:
  train      GRPO fine-tuning of a Qwen2/2.5/3-VL policy (mmgrpo train --help lists every option)
  plan       predicted peak memory per device for a train config (mmgrpo plan --help)
  check      see what the model sees: rendered prompts, tokens, frames, pixel budget, the ground truth's reward,
             for the first samples of a recipe's data (mmgrpo check --help); exit 1 on a contradiction
  make-tiny  write a tiny random Qwen-VL checkpoint for smoke runs: mmgrpo make-tiny DIR [family], family one of
             {' | '.join(ADAPTERS)} (default qwen2_5_vl)
"""


def train_main(argv: Sequence[str]) -> int:
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import parse_config_cli
    from mmgrpo.utils.profiles import expand_profile

    from mmgrpo.utils import exit_codes

    cfg = parse_config_cli(TrainConfig, expand_profile(argv, "vlm", "mmgrpo train"), prog="mmgrpo train",
                           description="GRPO / TempSamp-R1 / T-GRPO / Reg-GRPO / TW-GRPO for Qwen-VL policies. "
                                       "Options: defaults < --config YAML < --profile NAME < key=value overrides "
                                       "(--profile cpu: a CPU rehearsal, mmgrpo/utils/profiles.py).\n\n"
                                       + exit_codes.HELP)
    from mmgrpo.utils.runlock import release_run_lock

    def train() -> None:
        from mmgrpo.vlm.train.trainer import GRPOTrainer

        GRPOTrainer(cfg).train()

    try:
        return exit_codes.run_training("mmgrpo train", train)
    finally:
        release_run_lock(cfg.run.output_dir)  # the run is over (also when the trainer outlives this call)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "train":
        return train_main(rest)
    if cmd == "check":
        from mmgrpo.vlm.check import check_main

        return check_main(rest)
    if cmd == "plan":
        from mmgrpo.vlm.memory_plan import plan_main

        return plan_main(rest)
    if cmd == "make-tiny":
        if not rest:
            print("usage: mmgrpo make-tiny DIR [family]", file=sys.stderr)
            return 2
        family = rest[1] if len(rest) > 1 else "qwen2_5_vl"
        if family not in ADAPTERS:
            print(f"mmgrpo make-tiny: {unknown_family(family)}", file=sys.stderr)
            return 2
        from mmgrpo.vlm.models.tiny import save_tiny_model

        print(save_tiny_model(rest[0], family))
        return 0
    print(f"unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
