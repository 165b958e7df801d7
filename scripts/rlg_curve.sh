#!/usr/bin/env bash
# RL guidance (RLG) trade-off curve on mini-GenEval with the demo's tiny flow base (data/checkpoints/tiny_flow).
#
#   bash scripts/rlg_curve.sh [OUT=runs/rlg_curve] [WEIGHTS="0 0.5 1 1.5 2 3"] [BUDGET=90] [LORA=]
#
# 1. held-out / train prompts of the demo's tags (data/synthetic_t2i.py);
# 2. unless LORA=<dir> is given: a SHORT `flow_grpo train` run with the demo's T2I settings (method=fast, LoRA r 32,
#    lr 1e-3, 4 groups x 8 images per epoch), stopped after BUDGET process-CPU seconds (run.max_train_seconds);
# 3. eval/generate_t2i.py on the held-out prompts for every w in WEIGHTS with lora=<the trained LoRA> rlg_weight=w
#    (w=0: the base, w=1: the tuned model, w>1 extrapolates), same x_T seeds for every w (paired);
# 4. a table: mini-GenEval strict accuracy (GenEval "overall" and image-level), the partial reward (the training
#    reward), and the drift from the base: mean |pixel - pixel at w=0| over all images (0-255).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/rlg_curve}
WEIGHTS=${WEIGHTS:-"0 0.5 1 1.5 2 3"}
BUDGET=${BUDGET:-90}
BASE=data/checkpoints/tiny_flow
PY=${PY:-python}
mkdir -p "$OUT/prompts"
TAGS=$($PY -c "import json; print(' '.join(json.load(open('$BASE/mmgrpo_demo.json'))['tags']))")
$PY data/synthetic_t2i.py --all --split train --out "$OUT/prompts/train.jsonl" --tags $TAGS
$PY data/synthetic_t2i.py --all --split heldout --out "$OUT/prompts/heldout.jsonl" --tags $TAGS
COMMON=(sample.num_steps=10 sample.height=32 sample.width=32 sample.cfg=false sample.guidance_scale=1.0
        model.max_sequence_length=1)
if [ -z "${LORA:-}" ]; then
  $PY -m flow_grpo.cli train "model.pipeline_dir=$BASE" run.device=cpu \
    "data.train_path=$OUT/prompts/train.jsonl" "data.eval_path=$OUT/prompts/heldout.jsonl" \
    "reward.weights={mini_geneval: 1.0}" "reward.kwargs={mini_geneval: {mode: partial}}" method=fast \
    optim.adv_scale=group optim.adv_std_ddof=1 ema.enabled=false run.image_grid_every=0 run.save_every=0 \
    run.num_epochs=250 data.groups_per_epoch=4 data.group_size=8 optim.lr=1e-3 \
    run.max_train_seconds="$BUDGET" run.budget_clock=cpu run.tensorboard=false run.reward_curves=false \
    "run.output_dir=$OUT/train" "${COMMON[@]}"
  LORA=$($PY - "$OUT/train" <<'EOF'
import sys
from pathlib import Path
hits = sorted(Path(sys.argv[1]).rglob("pytorch_lora_weights.safetensors"), key=lambda p: p.stat().st_mtime)
if not hits:
    sys.exit(f"no exported LoRA under {sys.argv[1]}")
print(hits[-1].parent)
EOF
)
fi
echo "tuned LoRA: $LORA"
for w in $WEIGHTS; do
  $PY eval/generate_t2i.py "pipeline=$BASE" "prompts=$OUT/prompts/heldout.jsonl" "rewards=[mini_geneval]" \
    num_steps=10 guidance_scale=1.0 cfg=false height=32 width=32 max_sequence_length=1 batch_size=32 \
    images_per_prompt=8 grid_nrow=0 progress=false "lora=$LORA" "rlg_weight=$w" "out_dir=$OUT/eval_w$w"
done
$PY - "$OUT" $WEIGHTS <<'EOF'
import json, sys
from pathlib import Path
import numpy as np
from PIL import Image
out, ws = Path(sys.argv[1]), sys.argv[2:]
def images(w):
    rows = [json.loads(x) for x in (out / f"eval_w{w}" / "images.jsonl").read_text().splitlines()]
    return np.stack([np.asarray(Image.open(out / f"eval_w{w}" / r["image"])).astype(np.float64)
                     for r in sorted(rows, key=lambda r: r["index"])])
base = images(ws[0]) if float(ws[0]) == 0 else None
lines = ["| w | strict acc. overall (%) | strict acc. image-level (%) | partial reward | drift from base (mean abs px) |",
         "|---|---|---|---|---|"]
for w in ws:
    m = json.loads((out / f"eval_w{w}" / "metrics.json").read_text())
    (out / f"eval_w{w}" / "metrics.json").write_text(json.dumps(m, indent=1))
    g = m.get("mini_geneval", {})
    drift = "" if base is None else f"{np.abs(images(w) - base).mean():.2f}"
    lines.append(f"| {w} | {100 * g.get('overall', float('nan')):.1f} | {100 * g.get('accuracy', float('nan')):.1f}"
                 f" | {m['rewards']['mini_geneval/partial']['mean']:.3f} | {drift} |")
print("\n".join(lines))
(out / "rlg_curve.md").write_text("\n".join(lines) + "\n")
EOF
