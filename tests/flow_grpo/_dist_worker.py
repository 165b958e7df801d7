"""Launched by test_trainer_distributed.py: ``python -m torch.distributed.run --nproc_per_node 2 _dist_worker.py OUT``
(CPU, gloo, OMP_NUM_THREADS=1). Runs the cases of conftest.dist_case in one launch (imports are the expensive part):

1. ddp: LoRA, weighted sum with a NaN component (the dropped group is split across processes), KL, eval; dumps
   every process's trainable weights after each epoch. (Replicated-state resume is tested after SIGKILL in
   test_trainer_resume.py.)
2. win_rate: Pref-GRPO win rates of groups split across processes.
3. fsdp: full fine-tune with FSDP2 *forced on CPU* (accelerate only enables FSDP on accelerators; the trainer code
   path is the same), sharded checkpoints, resume from the epoch-1 checkpoint as in 1.
"""
import importlib.util
import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)
HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("flow_conftest", HERE / "conftest.py")
conf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conf)

from flow_grpo.config import load_train_config  # noqa: E402
from flow_grpo.train.trainer import FlowGRPOTrainer  # noqa: E402


def fsdp_accelerator():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    os.environ["ACCELERATE_USE_FSDP"] = "true"
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type="SHARDED_STATE_DICT",
                                            cpu_ram_efficient_loading=False)
    acc = Accelerator(cpu=True, fsdp_plugin=plugin, step_scheduler_with_optimizer=False)
    # accelerate picks MULTI_CPU whenever there is no accelerator; force the FSDP code path
    acc.state.distributed_type = DistributedType.FSDP
    acc.state.fsdp_plugin = plugin
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    assert acc.is_fsdp2
    return acc


def run(case: str, out: Path, rank: int, accelerator=None) -> dict:
    ov, rewards = conf.dist_case(case, out / case)
    cfg = load_train_config(None, ov)
    tr = FlowGRPOTrainer(cfg, adapter=conf.make_adapter("flux", lora=False), reward_fn=rewards,
                         accelerator=accelerator)
    dumps = out / "dumps"
    dumps.mkdir(exist_ok=True)

    def local_weights():
        return {n: (p.to_local() if hasattr(p, "to_local") else p).detach().clone() for n, p in tr.named_params}

    torch.save(local_weights(), dumps / f"{case}_init_r{rank}.pt")
    import flow_grpo.train.trainer as T

    orig = T.epoch_metrics

    def metrics_and_dump(traj, *a, **k):  # after the epoch's updates: its weights and rollout
        torch.save(local_weights(), dumps / f"{case}_e{tr.state.epoch}_r{rank}.pt")
        torch.save({"rewards": traj.rewards, "gids": traj.group_ids},
                   dumps / f"{case}_traj_e{tr.state.epoch}_r{rank}.pt")
        return orig(traj, *a, **k)

    T.epoch_metrics = metrics_and_dump
    hist = tr.train()
    T.epoch_metrics = orig
    res = {"world": tr.world, "sharded": tr.sharded, "history": hist, "type": type(tr.model).__name__}
    if case == "fsdp":  # resume the same trainer from the epoch-1 checkpoint and redo epoch 2 (sharded state)
        final = local_weights()
        ema = [s.clone() for s in tr.ema.shadow]
        tr.cfg.run.resume_from = str(out / case / "checkpoints" / "epoch-00000001")
        tr.resume()  # train() resumes once per trainer; this one continues from the older checkpoint
        tr.train(num_epochs=1)
        res["resume_equal"] = all(torch.equal(final[n], w) for n, w in local_weights().items())
        res["resume_ema_equal"] = all(torch.equal(a, b) for a, b in zip(ema, tr.ema.shadow))
    tr.close()
    return res


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    cases = sys.argv[2].split(",") if len(sys.argv) > 2 else ["ddp", "win_rate", "fsdp"]
    results = {}
    for case in cases:
        results[case] = run(case, out, rank, accelerator=fsdp_accelerator() if case == "fsdp" else None)
    (out / f"result_r{rank}.json").write_text(json.dumps(results, default=float))


if __name__ == "__main__":
    main()
