"""Issue-8 CPU-scale runs: Fashion-MNIST and synthetic, 3 seeds, 20 epochs."""
import sys
from creditaudit.experiments.scales import base_config
from creditaudit.sweep import LocalExecutor, run_sweep
def main():
    configs = []
    for dataset in ("fashion-mnist", "synthetic"):
        base = base_config("cpu", dataset=dataset, out_dir="/work/main/results/cpu")
        for seed in (42, 123, 456):
            variants = [{"method.name": m} for m in ("bp", "fa", "dfa", "frozen")]
            variants += [{"method.name": "dfa", "method.penalty": 0.01},
                         {"method.name": "bp", "method.penalty": 0.01},
                         {"method.name": "dfa", "model.out_ln": False}]
            for v in variants:
                configs.append(base.replace(**v, **{"run.seed": seed}))
        for lam in (1e-4, 1e-3, 1e-1):
            configs.append(base.replace(**{"method.name": "dfa", "method.penalty": lam}))
    print(len(configs), "runs", flush=True)
    result = run_sweep(configs, LocalExecutor(workers=2, threads_per_worker=1))
    print(result, flush=True)


if __name__ == "__main__":
    main()
