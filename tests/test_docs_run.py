"""Every command and snippet of README.md and docs/*.md runs as written.

- ```python blocks run as scripts (``python snippet.py``) in a subprocess, in one scratch
  folder per module that holds ``examples/``, ``docs/`` and ``scripts/`` of this checkout. A
  block that continues an earlier one says so on its first line (``# continued from …``) and
  gets the prelude of PRELUDES for that source; nothing else is added. When the sentence after
  a block says what it ``prints `…```, the output must contain it.
- ```bash blocks run command by command: ``creditaudit`` commands in this process through
  ``creditaudit.cli.main`` (in the scratch folder). Sizes shrink only through the documented
  ``CREDITAUDIT_SET`` environment variable (every run of ``train``, ``sweep`` and ``demo``
  becomes a tiny one) or a flag the command already uses (``--scale cpu`` → ``--scale
  smoke``). Placeholders (``RUN``, ``runs/dfa-…``, ``RESULTS_DIR``) become the folders that
  earlier commands wrote; SETUP trains what a block assumes exists.
- Benchmark commands (``benchmarks/…``) run as written in a subprocess, from the scratch
  folder whose ``.venv/bin/python`` is this interpreter, with the ``--quick`` flag every
  benchmark script takes (seconds at tiny sizes; docs/benchmarks.md says so): a benchmark
  that crashes fails here.
- What cannot run here is in SKIP with the reason, what takes too long for CI in SLOW (run
  with ``-m slow``; the block's other commands and the parse of all of them stay in CI). Every
  creditaudit command, run or not, is parsed by ``build_parser()``; other commands' scripts
  must exist and take the flags used.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.util
import io
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch

from creditaudit import registry  # reload_plugins: every axis
from creditaudit.cli import build_parser, main
from creditaudit.cli.common import ENV_OVERRIDES
from docs_support import ROOT, Block, Command, commands, doc_blocks, printed_fragments, usage_form
from plugin_support import forget_test_plugins, install_test_plugins

BLOCKS = doc_blocks()
BASH = [b for b in BLOCKS if b.lang == "bash"]
PYTHON = [b for b in BLOCKS if b.lang == "python"]

# Every run a command trains here: tiny, 1 epoch (n_train + n_test a multiple of 10 for
# MNIST-1D; train_subset shrinks file datasets such as Fashion-MNIST).
TINY = ("data.n_train=744 data.n_test=256 data.train_subset=512 data.in_dim=16 model.d=16 "
        "optim.epochs=1 optim.batch_size=64 diagnostics.eval_samples=256 "
        "diagnostics.rho_samples=32 diagnostics.rho_directions=4 diagnostics.null_draws=2")

# (pattern on the command as written, why it cannot run here).
SKIP = [
    (r"python3 -m venv|pip install", "installs packages (needs the network); .ci/run runs "
     "the README's set-up-and-test command itself"),
    (r"^source \.venv/bin/activate$", "activates the reader's shell; these tests already run "
     "in the environment (tests/test_readme.py checks the README says it)"),
    (r"cifar|--scale paper|results/paper", "needs CIFAR-10 (and its paper-scale runs), which "
     "this machine cannot download"),
    (r"--device cuda|gpu_checks\.sh", "needs a CUDA GPU (tests/test_cuda.py covers the GPU "
     "paths)"),
    (r"--executor ray|^ray start", "needs a Ray cluster (tests/test_sweep_ray.py starts a "
     "private one)"),
    (r"^wandb ", "needs a Weights & Biases account"),
    (r"^creditaudit train .*--wandb", "needs a Weights & Biases login; docs/logging.md's "
     "WANDB_MODE=offline command runs instead"),
    (r"^tensorboard ", "starts a web server that runs until it is stopped"),
    (r"audit_own_model\.py", "runs in tests/test_docs_outputs.py, which checks what it prints "
     "against docs/protocol.md"),
    (r"results/cpu|results/own|build_results_docs\.sh", "the study of docs/results.md: "
     "60 runs of minutes each on two cores, and its build script rewrites docs/results and "
     "docs/figures (tests/test_own_loop.py trains the two outside networks at tiny size)"),
    (r"build_literature_docs\.sh", "rewrites docs/results/literature and "
     "docs/figures/literature from the literature runs (tests/test_literature.py builds the "
     "summary and the figure from a smoke run)"),
]
# (pattern, why it is left to `pytest -m slow`): commands that take over half a minute here.
SLOW = [
    (r"benchmarks/docs_set\.sh", "every benchmark of docs/benchmarks.md again, each at its "
     "--quick size (each also runs alone in CI)"),
    (r"creditaudit sweep examples/sweeps/penalty_grid.toml --workers",
     "39 runs even at CREDITAUDIT_SET size"),
    (r"^creditaudit experiment all --scale (smoke|cpu)", "142 runs at smoke scale"),
    (r"^creditaudit (figures|report) RESULTS_DIR", "draws every figure of 16 runs, twice "
     "(README's figures and report commands run in CI)"),
]
# (doc, words in a python block, why it is left to `pytest -m slow`); in CI it is compiled
# and its imports resolved (test_python_block_imports).
SLOW_PYTHON = [
    ("README.md", "forward_from=net.run_from", "ρ and nudging in float64 on 1280 samples "
     "(half a minute on two cores)"),
    ("docs/protocol.md", "forward_from=model.run_from", "the same metrics on the same model"),
    ("docs/figures.md", "render_all", "draws every figure of 16 runs, twice"),
]
# Placeholders of the docs → what stands for them here (globs resolve in the scratch folder).
PLACEHOLDERS = {"RUN": "runs/dfa-resmlp-synthetic-s42-*", "RESULTS_DIR": "results",
                "DIR": "out", "OUT": "exported", "NAME": "synthetic"}
# (doc, first words of a block): commands to run before it — what the block takes as given.
SETUP = {
    ("README.md", "creditaudit train"): ["write my_run.toml"],
    ("README.md", "creditaudit audit"): ["creditaudit train --method dfa",
                                         "creditaudit train --method frozen"],
    ("docs/configuration.md", "creditaudit train --config"): ["write my_run.toml"],
    ("docs/configuration.md", "creditaudit train --method dfa --penalty"): [
        "creditaudit train --method dfa"],
    ("docs/protocol.md", "creditaudit audit"): ["creditaudit train --method dfa",
                                                "creditaudit train --method frozen"],
    ("docs/extending.md", "creditaudit train --method noisy-bp"): ["install noisy-bp"],
    ("docs/extending.md", "creditaudit train --method sparse-fa"): ["install sparse-fa"],
    ("docs/extending.md", "creditaudit train --method noisy-bp --arch plain-mlp"): [
        "install test plugins"],
    ("docs/records.md", "from pathlib"): ["creditaudit train --method dfa"],
    ("docs/figures.md", "creditaudit figures RESULTS_DIR"): [
        "creditaudit experiment audit_table --scale smoke --out results"],
    ("docs/figures.md", "from creditaudit.figures"): [
        "creditaudit experiment audit_table --scale smoke --out results"],
}

OWN_MODEL = '''\
import sys
sys.path.insert(0, "docs/examples")
from audit_own_model import diagnose, dfa_credit, trained_model
net, x_eval, y_eval, accuracy = trained_model()
model, eval_x, eval_y, my_credit = net, x_eval, y_eval, dfa_credit(net, 10)
'''
TRAINED_RUN = '''\
from creditaudit import RunConfig, train
from creditaudit.data import load_dataset
config = RunConfig().replace(**{"method.name": "dfa", "optim.epochs": 1, "data.n_train": 1024,
                                "model.d": 32, "diagnostics.end_of_run": False,
                                "run.out_dir": "runs/prelude"})
result = train(config)
model, rule = result.model, result.rule
eval_x, eval_y = load_dataset(config.data, seed=42).eval_subset(1280, flatten=True)
'''
# Source named by a block's "# continued from SOURCE: …" line → its prelude (None: the
# earlier blocks of the same page, back to the one that starts it).
PRELUDES = {"docs/examples/audit_own_model.py": OWN_MODEL, "a train() run": TRAINED_RUN,
            "the class NoisyBP above": None, "the class SparseFA above": None,
            "the class PlainMLPArchitecture above": None,
            "the class GaussianMixture above": None, "the class SoftmaxSaturation above": None}
# The rules of docs/examples/ that docs/extending.md installs: name → (module, class).
EXAMPLE_RULES = {"noisy-bp": ("noisy_bp", "NoisyBP"), "sparse-fa": ("sparse_fa", "SparseFA")}
CONTINUED = re.compile(r"^\s*# continued from (.+?)(?::|$)")


def rule_of(rules: list[tuple[str, str]], command: Command) -> str | None:
    return next((why for pattern, why in rules if re.search(pattern, command.raw)), None)


def block_id(block: Block) -> str:
    return f"{block.key} {block.first_line[:40]}"


def continued_from(block: Block) -> str | None:
    match = CONTINUED.match(block.text.lstrip("\n").splitlines()[0])
    return match.group(1) if match else None


def setup_for(block: Block) -> list[str]:
    return [step for (doc, start), steps in SETUP.items()
            if block.doc == doc and block.text.lstrip().startswith(start) for step in steps]


# --- the scratch folders ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    """One scratch folder per document (its commands build on each other, not on other
    pages'), holding this checkout's examples/, docs/ and scripts/."""
    folders: dict[str, Path] = {}

    def folder(doc: str) -> Path:
        if doc not in folders:
            folders[doc] = tmp_path_factory.mktemp(Path(doc).stem)
            for name in ("examples", "docs", "scripts", "benchmarks"):
                (folders[doc] / name).symlink_to(ROOT / name, target_is_directory=True)
            # The README's environment, as the docs' `.venv/bin/python …` commands name it:
            # this one (the folder itself, so the interpreter finds its site-packages).
            (folders[doc] / ".venv").symlink_to(Path(sys.executable).parent.parent,
                                               target_is_directory=True)
        return folders[doc]

    return folder


@contextlib.contextmanager
def inside(folder: Path, env: dict[str, str]):
    """cwd = ``folder`` and ``env`` set, both restored (with SIGTERM and torch's threads)."""
    previous_cwd, previous_env = os.getcwd(), {k: os.environ.get(k) for k in env}
    handler, threads = signal.getsignal(signal.SIGTERM), torch.get_num_threads()
    os.chdir(folder)
    os.environ.update(env)
    try:
        yield
    finally:
        os.chdir(previous_cwd)
        for key, value in previous_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        signal.signal(signal.SIGTERM, handler)
        torch.set_num_threads(threads)


def filled(argv: tuple[str, ...], block: Block) -> list[str]:
    """The command with its optional parts given and its named placeholders filled in."""
    out: list[str] = []
    for word in usage_form(argv):
        if word == "...":  # "creditaudit train ... --resume": the flags of the block's run
            first = next(c for c in commands(block) if c.argv[:2] == ("creditaudit", "train"))
            out.extend(first.argv[2:])
        else:
            out.append(PLACEHOLDERS.get(word, word))
    return out


def resolve(argv: tuple[str, ...], folder: Path, block: Block) -> list[str]:
    """``filled(argv)`` with run-folder patterns (``runs/dfa-…``) resolved in ``folder`` and
    experiments at smoke scale."""
    out: list[str] = []
    for word in filled(argv, block):
        if "*" in word or "…" in word or re.search(r"X{4}|Y{4}", word):
            pattern = re.sub(r"…|X{4}|Y{4}", "*", word)
            found = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)
            assert found, f"{block.key}: nothing in the scratch folder matches {word!r}"
            word = str(found[-1].relative_to(folder))
        out.append(word)
    if out[:2] == ["creditaudit", "experiment"] and "--scale" in out:
        at = out.index("--scale") + 1
        out[at] = "smoke"  # the flag the command already uses, at its smallest scale
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv[1:])


def run_cli(command: Command, argv: list[str], folder: Path) -> str:
    """Run a creditaudit command here in-process, as the shell would; returns its stdout."""
    written = [w for flag, w in zip(argv, argv[1:]) if flag in ("--out", "--output")]
    assert not any(w.startswith(("/", "~")) for w in written), \
        f"{command.raw}: writes outside the scratch folder; use a relative path in the docs"
    out, err = io.StringIO(), io.StringIO()
    shrink = TINY
    if "data.in_dim=" in command.raw:  # an image architecture's view of the synthetic task
        shrink = " ".join(w for w in TINY.split() if not w.startswith("data.in_dim="))
    env = {ENV_OVERRIDES: shrink, **dict(command.env)}
    with inside(folder, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv[1:])
    if command.stdout:
        (folder / command.stdout).write_text(out.getvalue())
    assert code == 0, f"{command.raw} exited {code}:\n{err.getvalue()[-3000:]}"
    return out.getvalue()


def run_setup(step: str, folder: Path) -> None:
    if step == "write my_run.toml":  # the config file docs/configuration.md shows
        toml = next(b for b in doc_blocks() if b.lang == "toml"
                    and b.first_line == "# my_run.toml")
        (folder / "my_run.toml").write_text(toml.text)
    elif step.removeprefix("install ") in EXAMPLE_RULES:  # what `pip install` of the
        # example package leaves
        name = step.removeprefix("install ")
        module, cls = EXAMPLE_RULES[name]
        site = folder / f"site-{name}"
        if not site.exists():
            site.mkdir()
            shutil.copy(ROOT / "docs" / "examples" / f"{module}.py", site)
            info = site / f"{module}_rule-0.1.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-rule\n"
                                           "Version: 0.1\n")
            (info / "entry_points.txt").write_text(
                f"[creditaudit.rules]\n{name} = {module}:{cls}\n")
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
        registry.reload_plugins()
    elif step == "install test plugins":  # tests/plugin_pkg, as `pip install` leaves it
        site = install_test_plugins(folder / "site-plugins")
        if str(site) not in sys.path:
            sys.path.insert(0, str(site))
        registry.reload_plugins()
    else:
        command = Command(step, tuple(step.split()))
        run_cli(command, list(command.argv), folder)


@pytest.fixture
def noisy_bp_plugin(workdirs):
    """The docs/extending.md plugins, uninstalled again after the test."""
    yield
    folder = workdirs("docs/extending.md")
    installed = [str(folder / name) for name in (*(f"site-{n}" for n in EXAMPLE_RULES),
                                                 "site-plugins")
                 if str(folder / name) in sys.path]
    for site in installed:
        sys.path.remove(site)
    if installed:
        for module, _ in EXAMPLE_RULES.values():
            sys.modules.pop(module, None)
        forget_test_plugins()
        registry.reload_plugins()


# --- the checks -------------------------------------------------------------------------------
def test_every_block_is_labelled_and_commands_sit_in_bash_blocks():
    """A command in an unlabelled or text block would escape these tests."""
    unlabelled = [b.key for b in BLOCKS if b.lang not in ("bash", "python", "toml", "json",
                                                           "text")]
    assert not unlabelled, f"label these blocks (```bash, ```python, ```text, …): {unlabelled}"
    hidden = [b.key for b in BLOCKS if b.lang != "bash" and re.search(
        r"^(\$ )?creditaudit (demo|train|audit|sweep|experiment|export|figures|report)\b",
        b.text, flags=re.M)]
    assert not hidden, f"commands outside ```bash blocks: {hidden}"


def test_docs_cite_no_file_users_do_not_have():
    """The science is in docs/science.md; nothing cites the internal spec."""
    cites = [f"{p.relative_to(ROOT)}:{n}" for p in [ROOT / "README.md",
                                                    *(ROOT / "docs").rglob("*.md")]
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\bSPEC\b|SPEC\.md", line)]
    assert not cites, f"cite science.md §N instead: {cites}"


def bound_names(code: str) -> set[str]:
    """The names ``code`` binds at module level: imports, definitions, assignments."""
    names: set[str] = set()
    for node in ast.parse(code).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def header_names(block: Block) -> list[str]:
    """What a continued block's leading comment lists after its colon (asides in parentheses
    dropped): ``# continued from SOURCE: net, x_eval (…)`` → ``["net", "x_eval"]``."""
    lines = block.text.lstrip("\n").splitlines()
    header = []
    for line in lines:
        if not line.strip().startswith("#"):
            break
        header.append(line.strip().lstrip("#"))
    text = " ".join(header)
    if ":" not in text:
        return []
    return [w for w in re.split(r"[,\s]+", re.sub(r"\([^()]*\)", "", text.split(":", 1)[1]))
            if w]


def test_every_continued_block_names_a_prelude():
    """A continued block's header lists names, each bound by its prelude. Code in the header
    would be a comment the tests never run (docs/protocol.md once showed a call there that
    raised TypeError): a block that needs more than names runs that code itself."""
    for block in PYTHON:
        source = continued_from(block)
        if source is None:
            continue
        assert source in PRELUDES, f"{block.key}: no prelude for {source!r}"
        listed = header_names(block)
        code = [w for w in listed if not w.isidentifier()]
        assert not code, f"{block.key}: its '# continued from' line lists {code}, which is " \
            "code in a comment; write that code in the block so it runs"
        missing = set(listed) - bound_names(prelude(block))
        assert not missing, f"{block.key}: the prelude binds no {sorted(missing)}"


def test_every_skipped_or_slow_rule_still_matches_a_command():
    """A rule left behind after the docs changed would hide nothing — or the wrong thing."""
    raws = [c.raw for b in BASH for c in commands(b)]
    for pattern, _ in SKIP + SLOW:
        assert any(re.search(pattern, raw) for raw in raws), f"unused rule {pattern!r}"
    for doc, words, _ in SLOW_PYTHON:
        assert any(b.doc == doc and words in b.text for b in PYTHON), f"unused {words!r}"


@pytest.mark.parametrize("block", BASH, ids=block_id)
def test_every_command_parses(block, workdirs, noisy_bp_plugin):
    """Run or not, each creditaudit command line is one the CLI accepts; other commands name
    scripts that exist and flags those scripts take."""
    for command in commands(block):
        if command.is_creditaudit:
            argv = filled(command.argv, block)
            for name in EXAMPLE_RULES:
                if name in argv:
                    run_setup(f"install {name}", workdirs(block.doc))
            parse(argv)
            continue
        # Scripts of this repository (not a git revision's file, nor a scratch copy in /tmp).
        scripts = [w for w in command.argv
                   if w.endswith(".py") and ":" not in w and not w.startswith("/")]
        for script in scripts:
            source = (ROOT / script).read_text()
            for flag in (w for w in command.argv if w.startswith("--")):
                assert f'"{flag}"' in source, f"{command.raw}: {script} has no {flag}"


def data_dirs(argv: list[str], folder: Path) -> list[str]:
    """The data folders a command reads: ``--data-dir`` and ``data_dir`` of a TOML
    ``--config`` in ``folder``."""
    pairs = list(zip(argv, argv[1:]))
    found = [w for flag, w in pairs if flag == "--data-dir"]
    for flag, name in pairs:
        path = folder / name
        if flag == "--config" and path.suffix == ".toml" and path.is_file():
            data_dir = tomllib.loads(path.read_text()).get("data", {}).get("data_dir")
            found += [data_dir] if data_dir else []
    return found


def run_bash_block(block: Block, folder: Path, slow: bool) -> None:
    for step in setup_for(block):
        run_setup(step, folder)
    for command in commands(block):
        if rule_of(SKIP, command) or (rule_of(SLOW, command) and not slow):
            continue
        if not command.is_creditaudit:
            if not run_benchmark(command, folder, block):  # e.g. `python scripts/…`
                pytest.fail(f"{command.raw}: neither run nor in SKIP; add it to one of them")
            continue
        argv = resolve(command.argv, folder, block)
        parse(argv)
        if any(not Path(d).is_dir() for d in data_dirs(argv, folder)):
            continue  # e.g. no Fashion-MNIST on this machine (apt-get install
            # dataset-fashion-mnist puts it where the docs say)
        run_cli(command, argv, folder)


# What a benchmark needs beyond this checkout: (script, why it cannot run without, check).
BENCHMARK_NEEDS = [
    ("bench_peers.py", "BioTorch is not installed (pip install --no-deps biotorch==0.0.16)",
     lambda: importlib.util.find_spec("biotorch") is not None),
    ("bench_ep.py", "no Fashion-MNIST in /usr/share/datasets/fashion-mnist",
     lambda: Path("/usr/share/datasets/fashion-mnist").is_dir()),
]


def run_benchmark(command: Command, folder: Path, block: Block) -> bool:
    """Run a ``benchmarks/`` command as written plus ``--quick`` (where the script has it);
    False when ``command`` is no benchmark. A benchmark whose outside needs are missing here
    is left out."""
    script = next((w for w in command.argv if w.startswith("benchmarks/")), None)
    if script is None:
        return False
    for name, _, present in BENCHMARK_NEEDS:
        if script.endswith(name) and not present():
            return True
    # Its size flag where it has one (bench_end_of_run.py measures the runs it is given,
    # which the block's train commands made tiny).
    quick = ["--quick"] if "--quick" in (ROOT / script).read_text() else []
    argv = [*resolve(command.argv, folder, block), *quick]
    env = {k: v for k, v in os.environ.items() if k != ENV_OVERRIDES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"),
                                                    env.get("PYTHONPATH")) if p)
    proc = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n" \
        f"{proc.stderr[-3000:]}"
    if script.endswith(".sh"):  # the set goes on past a failing benchmark: read its files
        out = folder / argv[argv.index(script) + 1]
        failed = [p.name for p in out.glob("*.txt") if "# FAILED" in p.read_text()]
        assert not failed, f"{' '.join(argv)}: these benchmarks failed: {failed}"
    return True


@pytest.mark.parametrize("block", BASH, ids=block_id)
def test_bash_block_runs(block, workdirs, noisy_bp_plugin):
    run_bash_block(block, workdirs(block.doc), slow=False)


SLOW_BLOCKS = [b for b in BASH if any(rule_of(SLOW, c) for c in commands(b))]


@pytest.mark.slow
@pytest.mark.parametrize("block", SLOW_BLOCKS, ids=block_id)
def test_bash_block_runs_in_full(block, workdirs, noisy_bp_plugin):
    run_bash_block(block, workdirs(block.doc), slow=True)


def prelude(block: Block) -> str:
    source = continued_from(block)
    if source is None:
        return ""
    if PRELUDES[source] is not None:
        return PRELUDES[source]
    page = [b for b in PYTHON if b.doc == block.doc and b.line < block.line]
    start = max(i for i, b in enumerate(page) if continued_from(b) is None)
    return "".join(b.text for b in page[start:])


def slow_python(block: Block) -> str | None:
    return next((why for doc, words, why in SLOW_PYTHON
                 if block.doc == doc and words in block.text), None)


@pytest.mark.parametrize("block", PYTHON, ids=block_id)
def test_python_block_imports(block):
    """Every block compiles (with its prelude) and every name it imports exists."""
    skip_without_optional_packages(block)
    code = prelude(block) + block.text
    tree = ast.parse(code, filename=block.key)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "audit_own_model":
                continue  # docs/examples/audit_own_model.py, on the path of the prelude
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"), f"{block.key}: {node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)


# Packages a docs page uses that creditaudit does not install (→ how to get them). CI has
# torch 2.13 and none of them: their blocks are skipped there, and run where they are.
OPTIONAL_PACKAGES = {name: "pip install torch==2.14.1 torchvision==0.29.1 timm transformers "
                     "(README: 'Beside torchvision, timm and transformers')"
                     for name in ("torchvision", "timm", "transformers")}


def skip_without_optional_packages(block: Block) -> None:
    """Skip ``block`` with the reason when a package of OPTIONAL_PACKAGES it imports is not
    installed here."""
    tree = ast.parse(prelude(block) + block.text, filename=block.key)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    missing = sorted(n for n in imported & set(OPTIONAL_PACKAGES)
                     if importlib.util.find_spec(n) is None)
    if missing:
        pytest.skip(f"{block.key} needs {', '.join(missing)}, not installed here: "
                    f"{OPTIONAL_PACKAGES[missing[0]]}")


PYTHON_FAST = [b for b in PYTHON if not slow_python(b)]
PYTHON_SLOW = [b for b in PYTHON if slow_python(b)]


@pytest.mark.parametrize("block", PYTHON_FAST, ids=block_id)
def test_python_block_runs(block, workdirs):
    run_python_block(block, workdirs(block.doc))


@pytest.mark.slow
@pytest.mark.parametrize("block", PYTHON_SLOW, ids=block_id)
def test_python_block_runs_in_full(block, workdirs):
    run_python_block(block, workdirs(block.doc))


def run_python_block(block: Block, workdir: Path) -> None:
    skip_without_optional_packages(block)
    for step in setup_for(block):
        run_setup(step, workdir)
    script = workdir / f"snippet_{Path(block.doc).stem}_{block.line}.py"
    script.write_text(prelude(block) + block.text)
    env = {k: v for k, v in os.environ.items() if k != ENV_OVERRIDES}
    proc = subprocess.run([sys.executable, script.name], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{block.key} failed:\n{proc.stderr[-3000:]}"
    for fragment in printed_fragments(block):
        assert fragment in proc.stdout, f"{block.key} should print {fragment!r}; it printed " \
                                        f"{proc.stdout[-2000:]!r}"


def test_a_fenced_block_inside_a_list_item_is_read(tmp_path, monkeypatch):
    """An indented fence (a block in a list item) is a block too, read without its indent:
    a command there would otherwise escape every test of the docs."""
    import docs_support

    monkeypatch.setattr(docs_support, "ROOT", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("- a step:\n\n  ```bash\n  creditaudit demo\n  ```\n\n```\nplain\n```\n")
    blocks = doc_blocks([page])
    assert [(b.lang, b.text) for b in blocks] == [("bash", "creditaudit demo\n"),
                                                  ("", "plain\n")]


def inline_commands() -> list[tuple[str, list[str]]]:
    """(doc, words) of every `creditaudit …` code span in the prose of README.md and docs/
    (spans broken over a line joined; a pipe's tail dropped)."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        prose = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for span in re.findall(r"`(creditaudit [^`]+)`", re.sub(r"\s*\n\s*", " ", prose)):
            found.append((doc.name, span.split(" | ")[0].split()))
    return found


def test_every_command_in_the_prose_names_a_command_and_its_flags():
    """The blocks' commands are parsed above; one a sentence names (`creditaudit demo
    --dataset synthetic`) is typed as well: its command and each flag must exist there."""
    commands_ = next(a for a in build_parser()._actions
                     if isinstance(a, argparse._SubParsersAction)).choices
    wrong = []
    for doc, words in inline_commands():
        if words[1] not in commands_:
            if words[1] not in ("…", "--help", "--version"):
                wrong.append(f"{doc}: no command {words[1]!r} in {' '.join(words)}")
            continue
        options = {o for a in commands_[words[1]]._actions for o in a.option_strings}
        wrong += [f"{doc}: {words[1]} has no {flag} ({' '.join(words)})"
                  for flag in (w.split("=")[0] for w in words[2:] if w.startswith("-"))
                  if flag not in options]
    assert not wrong, "\n".join(wrong)


def test_the_sparse_fa_example_is_the_code_the_page_shows():
    """docs/examples/sparse_fa.py, which the `creditaudit train --method sparse-fa` command
    installs, is the class docs/extending.md shows and checks (its docstring aside)."""
    code = (ROOT / "docs" / "examples" / "sparse_fa.py").read_text().split('"""\n\n', 1)[1]
    assert any(b.doc == "docs/extending.md" and b.text == code for b in PYTHON), \
        "docs/examples/sparse_fa.py and its block in docs/extending.md differ: make them one"
