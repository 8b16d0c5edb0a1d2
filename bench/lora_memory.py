"""Peak memory of an RL run with and without a KL reference, with LoRA and with full
fine-tuning (issue 3: with LoRA the reference is the adapter-disabled base, so it should
cost almost nothing; a full fine-tune keeps a frozen copy).

Each variant is a separate `agentgym-rl train` process on BabyAI (2 GRPO steps, horizon 2)
with a ~100M-parameter model built here, so that a model copy is visible next to the
Python/torch baseline; the process's peak RSS (ru_maxrss) is reported, overall and just
before the checkpoint written at the last step (with LoRA that merges the adapter into a
copy of the model).

Every variant trains on the same rows (`algo.skip_zero_advantage=false`): an untrained model
never succeeds on BabyAI, so every advantage is 0, and by default a run without a KL loss
would skip all rows and do no backward pass at all, while a run with one trains on each row.
`--skip-zero-advantage` measures with the trainer's default instead.

Usage: python bench/lora_memory.py [--hidden 768 --layers 12] [--skip-zero-advantage]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = {
    "LoRA r=8, no reference": ["model.lora_rank=8", "algo.kl_coef=0"],
    "LoRA r=8, KL reference (adapter off)": ["model.lora_rank=8", "algo.kl_coef=0.001"],
    "full fine-tune, no reference": ["algo.kl_coef=0"],
    "full fine-tune, KL reference (frozen copy)": ["algo.kl_coef=0.001"],
}


def build(folder: Path, hidden: int, layers: int) -> int:
    from agentgym_rl.agent.tiny import TinyModelConfig, build_tiny
    from agentgym_rl.train.demonstrations import collect_expert, conversation_text

    corpus = conversation_text(collect_expert("babyai", "train", 50, env_kwargs={"list_actions": False}))
    config = TinyModelConfig(hidden_size=hidden, num_layers=layers, num_heads=hidden // 64,
                             num_kv_heads=hidden // 64, intermediate_size=4 * hidden)
    build_tiny(corpus, folder, config)
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(folder).parameters())


# Runs the CLI in-process and records the peak RSS when the last checkpoint starts (the
# only save: save_every is larger than the run), then at exit.
CHILD = """import resource
from agentgym_rl.cli import main
from agentgym_rl.train.rl import RLTrainer

def peak_kb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

save = RLTrainer.save
def measured_save(self, step):
    print('BEFORE_SAVE_KB', peak_kb())
    save(self, step)
RLTrainer.save = measured_save
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
print('PEAK_KB', peak_kb())
"""


def run_variant(model: Path, out: Path, name: str, overrides: list[str]) -> dict[str, float]:
    """Peak RSS (MiB) before the final save and overall, and the rows trained over the run."""
    run_name = f"v{abs(hash(name))}"
    args = [sys.executable, "-c", CHILD, "train", str(REPO / "configs" / "babyai_grpo.yaml"),
            f"model.path={model}", "warmup.episodes=0", f"run.output_dir={out}", f"run.name={run_name}",
            "train.steps=2", "train.validate_every=0", "train.save_every=1000", "train.save_trajectories=false",
            "algo.tasks_per_step=4", "algo.group_size=4", "schedule.horizons=[2]", "rollout.max_new_tokens=16",
            "optim.micro_batch_size=4", *overrides]
    result = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stderr[-2000:]}")
    kb = {key: int(value) for key, value in (ln.split() for ln in result.stdout.splitlines()
                                             if ln.startswith(("PEAK_KB ", "BEFORE_SAVE_KB ")))}
    rows = [json.loads(line) for line in (out / run_name / "metrics.jsonl").read_text().splitlines()]
    return {"before_save": kb["BEFORE_SAVE_KB"] / 1024, "peak": kb["PEAK_KB"] / 1024,
            "rows": sum(r.get("update/trajectories", 0) for r in rows)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--skip-zero-advantage", action="store_true",
                        help="keep the trainer's default: rows with zero advantage are skipped without a KL loss")
    args = parser.parse_args()
    same_rows = [] if args.skip_zero_advantage else ["algo.skip_zero_advantage=false"]
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        params = build(model, args.hidden, args.layers)
        print(f"model: {params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MiB in float32)")
        runs = {name: run_variant(model, Path(tmp) / "runs", name, [*overrides, *same_rows])
                for name, overrides in VARIANTS.items()}
    print("\n| variant | rows trained | peak RSS before the final save (MiB) | peak RSS (MiB) |\n|---|---|---|---|")
    for name, run in runs.items():
        print(f"| {name} | {run['rows']} | {run['before_save']:.0f} | {run['peak']:.0f} |")
    peaks = {name: run["peak"] for name, run in runs.items()}
    lora = peaks["LoRA r=8, KL reference (adapter off)"] / peaks["LoRA r=8, no reference"] - 1
    full = peaks["full fine-tune, KL reference (frozen copy)"] / peaks["full fine-tune, no reference"] - 1
    print(f"\nA KL reference adds {100 * lora:+.1f}% peak memory with LoRA, {100 * full:+.1f}% with a full fine-tune.")


if __name__ == "__main__":
    main()
