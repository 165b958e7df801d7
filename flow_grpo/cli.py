"""``flow_grpo`` command line: ``flow_grpo train [--config cfg.yaml] [key=value ...]``.

``flow_grpo train --help`` lists every option (dotted name, type, default, help). Heavy libraries are imported only
when training starts.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from mmgrpo.utils import exit_codes

_DESCRIPTION = """GRPO for flow-matching text-to-image models (SD3 / FLUX) with exact per-step SDE log-probs.

Methods are presets (method=flow|dance|fast|mix|mix_flash|tp_grpo|g2rpo) over one trainer; every preset value can be
overridden. Examples:
  flow_grpo train model.tiny=sd3 method=fast data.prompts='[a cat, a dog]' run.num_epochs=2
  flow_grpo train --config my.yaml reward.weights='{pickscore: 1.0, ocr: 0.5}' reward.mode=per_reward
  accelerate launch --config_file scripts/accelerate_configs/multi_gpu.yaml --num_processes 8 \\
      -m flow_grpo.cli train --config my.yaml model.pipeline_dir=/ckpt/sd3.5m
  accelerate launch --config_file scripts/accelerate_configs/fsdp.yaml -m flow_grpo.cli train \\
      model.lora.enabled=false ...      (full fine-tune; sample.credit must be outcome)
Precedence: defaults < method preset < YAML < --profile NAME < key=value (--profile cpu: a CPU rehearsal of the
recipe on its real, depth-cut model; mmgrpo/utils/profiles.py lists what it sets).

Processes: the transformer, optimizer and LR schedule go through accelerator.prepare (DDP / FSDP / DeepSpeed per the
accelerate config); a launch whose process count accelerate does not honour is refused. Only CPU runs were verified
here (2 processes, gloo: DDP, and FSDP2 forced on CPU); GPU FSDP1 / DeepSpeed follow the standard accelerate path
untested. Faults: non-finite rewards drop their samples (reward.on_nonfinite), failing reward calls are retried then
dropped or stop the run (reward.retries/timeout/on_failure), non-finite advantages/loss/gradients skip the optimizer
step and optim.max_consecutive_skips in a row write <output_dir>/halted and stop; epochs where no group kept two valid
rewards (e.g. the reward server is down) skip their steps the same way. Resume: run.resume_from=auto (a missing or
damaged final export is rewritten). One run per run.output_dir (<output_dir>/.lock). SIGTERM / SIGINT (preemption,
Ctrl-C) finish the epoch (or discard it while still sampling), write a checkpoint on every process and exit 6.
Trust: a config is code. reward.weights / reward.pairwise_scorer entries of the form 'package.module:factory' are
imported and called (the plugin mechanism for your own rewards), so {'os:system': 1} would call os.system: only run
config files and overrides you trust. A remote reward server checks MMGRPO_REWARD_TOKEN when it is set (see
python -m flow_grpo.rewards.server --help).

""" + exit_codes.HELP


def _make_tiny(cmd: str, rest: Sequence[str]) -> int:
    """``make-tiny DIR [KIND]``: a tiny random pipeline saved as a folder (``model.pipeline_dir=DIR``);
    ``make-tiny-reward DIR [NAME]``: a tiny random reward model in its release's folder layout. For rehearsing a run
    on CPU without downloads (docs/experiments.md, "CPU rehearsal")."""
    import argparse

    from .models import TINY_BUILDERS
    p = argparse.ArgumentParser(prog=f"flow_grpo {cmd}")
    p.add_argument("dir", help="output folder")
    if cmd == "make-tiny":
        p.add_argument("kind", nargs="?", default="sd3", choices=sorted(TINY_BUILDERS),
                       help="pipeline kind (default sd3)")
    else:
        p.add_argument("name", nargs="?", default="pickscore", choices=["pickscore"], help="reward (default pickscore)")
    p.add_argument("--seed", type=int, default=0, help="random-weight seed")
    a = p.parse_args(list(rest))
    if cmd == "make-tiny":
        from .models import save_tiny_pipeline

        print(save_tiny_pipeline(a.dir, a.kind, seed=a.seed))
        print(f"use it with model.pipeline_dir={a.dir} (random weights: it generates noise)", file=sys.stderr)
        return exit_codes.OK
    from .rewards.tiny import TINY_REWARDS

    kw = TINY_REWARDS[a.name](a.dir, seed=a.seed)
    flow = ", ".join(f"{k}: {v}" for k, v in kw.items())
    print(f"reward.kwargs='{{{a.name}: {{{flow}}}}}'")
    print(f"random weights: the scores mean nothing; use the printed reward.kwargs (eval: reward_kwargs=...)",
          file=sys.stderr)
    return exit_codes.OK


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: flow_grpo train|plan|check [--config FILE] [--print-config] [key=value ...]\n"
              "  check: the text-encoder tokens (truncation), sigma schedule and epoch-0 step plan of a recipe and its "
              "prompts, no weights loaded (flow_grpo check --help)\n"
              "       flow_grpo make-tiny DIR [KIND]          a tiny random pipeline folder (KIND: sd3 (default), "
              "flux, wan, ...)\n"
              "       flow_grpo make-tiny-reward DIR [NAME]   a tiny random reward model (NAME: pickscore)\n\n"
              + _DESCRIPTION)
        return exit_codes.OK
    cmd, rest = argv[0], argv[1:]
    if cmd in ("make-tiny", "make-tiny-reward"):
        return _make_tiny(cmd, rest)
    if cmd == "plan":  # predicted peak memory per device for the same config (flow_grpo plan --help)
        from .memory_plan import plan_main

        return plan_main(rest)
    if cmd == "check":  # text-encoder tokens, sigma schedule and epoch-0 step plan (flow_grpo check --help)
        from .check import check_main

        return check_main(rest)
    if cmd != "train":
        print(f"unknown command {cmd!r}; available: train, plan, check, make-tiny, make-tiny-reward",
              file=sys.stderr)
        return 2
    from mmgrpo.utils.config import config_argparser, config_to_yaml

    from .config import TrainConfig, load_train_config

    parser = config_argparser(TrainConfig, prog="flow_grpo train", description=_DESCRIPTION)
    for action in parser._actions:  # the shared parser's example names keys of another config
        if action.dest == "overrides":
            action.help = "config overrides, e.g. optim.lr=1e-4 model.lora.rank=8 run.num_epochs=50"
    from mmgrpo.utils.profiles import expand_profile

    args = parser.parse_args(expand_profile(rest, "flow", "flow_grpo train"))
    try:
        cfg = load_train_config(args.config, args.overrides)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    if args.print_config:
        sys.stdout.write(config_to_yaml(cfg))
        return 0

    def train() -> None:
        from .train.trainer import train_from_config

        train_from_config(cfg)

    return exit_codes.run_training("flow_grpo train", train)


if __name__ == "__main__":
    sys.exit(main())
