#!/usr/bin/env bash
# The GPU checks in one script: the CUDA-marked tests, the experiment configs that need CUDA, the attention and
# MoE benchmarks on the device in bf16, and bf16-mixed training throughput of a mid-size model per attention
# backend. Every step has its own time limit and writes its log under OUT_DIR, so a cut-short run still reports.
# Prepared for a GPU session; so far only its CPU-runnable parts have run (no device was lent yet).
#   bash experiments/bench/cuda_check.sh [OUT_DIR] [tests|timings|all]      (default outputs/cuda_check all)
set -u
OUT_DIR=${1:-outputs/cuda_check}
PART=${2:-all}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT_DIR/device.txt"
$PY -c "import torch, lightning; print('torch', torch.__version__, 'lightning', lightning.__version__)" \
    | tee -a "$OUT_DIR/device.txt"

# 1. the tests that need a GPU, and every experiment config (flex / flash_attn run only there)
if [ "$PART" != timings ]; then
    timeout 300 $PY -m pytest tests -m cuda -rs 2>&1 | tee "$OUT_DIR/tests.log"
    timeout 240 $PY -m pytest tests/training/test_experiments.py -rs 2>&1 | tee -a "$OUT_DIR/tests.log"
fi
[ "$PART" = tests ] && exit 0

# 2. kernels: packed attention (S = 16384, bf16) and one MoE layer (bf16, 32768 tokens)
timeout 150 $PY experiments/bench/attention.py --device cuda --dtype bfloat16 --seq-len 16384 --reps 10 \
    --packs equal-rules,mix-rules 2>&1 | tee "$OUT_DIR/bench.log"
timeout 90 $PY experiments/bench/moe.py --device cuda --dtype bfloat16 --tokens 32768 --repeats 10 2>&1 \
    | tee -a "$OUT_DIR/bench.log"

# 3. bf16-mixed training throughput per attention backend: 1024 hidden, 8 layers, 64 experts top-8, S = 8192
MODEL="model.config.hidden_size=1024 model.config.intermediate_size=4096 model.config.num_hidden_layers=8
 model.config.num_attention_heads=16 model.config.num_key_value_heads=4 model.config.head_dim=64
 model.config.rotary_dim=32 model.config.num_experts=64 model.config.num_experts_per_tok=8 model.config.n_group=8
 model.config.topk_group=4 model.config.moe_intermediate_size=512 model.config.channel_heads=8"
for backend in sdpa_dense segmented flex; do
    # shellcheck disable=SC2086
    timeout 110 $PY -m lumina.cli.train trainer=gpu $MODEL model.config.attn_backend=$backend data.seq_len=8192 \
        'data.sources.0.options.num_samples=3000' trainer.max_steps=30 trainer.limit_val_batches=0 \
        callbacks.checkpoint=null callbacks.hf_export=null callbacks.expert_usage=null callbacks.progress_bar=null \
        logger=csv hydra.run.dir="$OUT_DIR/train_$backend" > "$OUT_DIR/train_$backend.log" 2>&1
    $PY - "$OUT_DIR/train_$backend" "$backend" <<'EOF' | tee -a "$OUT_DIR/bench.log"
import csv, glob, statistics, sys
files = glob.glob(f"{sys.argv[1]}/**/metrics.csv", recursive=True)
rows = [r for f in files for r in csv.DictReader(open(f)) if r.get("train/tokens_per_sec")]
rates = [float(r["train/tokens_per_sec"]) for r in rows][10:]  # past compilation and warm-up
print(f"train bf16-mixed {sys.argv[2]}: " + (f"median {statistics.median(rates):.0f} tokens/s over {len(rates)} steps"
                                            if rates else "no steps logged (see its log)"))
EOF
done
