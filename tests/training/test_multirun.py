"""The README's ablation sweep `lumina-train -m 'experiment=glob(ablation_*)'` is one Hydra multirun over every
ablation experiment. (Each job is stopped by a deliberate config error right after composition, which keeps the
test fast and also shows that a sweep reports one line per failed job; test_experiments.py runs each ablation.)"""

from __future__ import annotations

from omegaconf import OmegaConf
from train_helpers import CONF_DIR, run_cli


def test_glob_sweep_composes_every_ablation_as_one_job(tmp_path):
    ablations = sorted(p.stem for p in (CONF_DIR / "experiment").glob("ablation_*.yaml"))
    assert len(ablations) == 12  # six pairs: attention, balance, text weight, router, head, schedule
    result = run_cli(["-m", "experiment=glob(ablation_*)", "trainer.max_steps=0", f"hydra.sweep.dir={tmp_path}"],
                     cwd=tmp_path)
    jobs = sorted(p for p in tmp_path.iterdir() if (p / ".hydra" / "overrides.yaml").is_file())
    swept = sorted(next(o.split("=", 1)[1] for o in OmegaConf.load(job / ".hydra" / "overrides.yaml")
                        if o.startswith("experiment=")) for job in jobs)
    assert swept == ablations
    for job in jobs:  # each job composed its own experiment
        config = OmegaConf.load(job / ".hydra" / "config.yaml")
        assert config.trainer.val_check_interval == 50  # experiment/ablation/base.yaml
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2
    assert len(errors) == len(ablations) and all(line.startswith("lumina-train: error: trainer.max_steps=0:") for line in errors)
