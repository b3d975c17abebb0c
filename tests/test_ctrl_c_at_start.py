"""Ctrl-C while a command starts: in its first second or two (the package importing torch)
it printed a Python traceback and died of SIGINT (exit -2), or was lost — torch's import
cleared the KeyboardInterrupt and the command ran to its end (exit 0). The entry
(:mod:`creditaudit.cli`) imports the standard library only and holds Ctrl-C while the
command starts: at any moment it ends in one line and exit code 130, as later."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import creditaudit
import creditaudit.cli
from creditaudit.cli import INTERRUPTED, command, held_interrupts, main

TRAIN = ("train", "--method", "dfa", "--dataset", "synthetic", "--epochs", "50",
         "--threads", "1", "--set", "data.n_train=512", "--no-progress")
# ``creditaudit`` (the console script's code) and ``python -m creditaudit``
SCRIPT = (sys.executable, "-c", "import sys\nfrom creditaudit.cli import main\nsys.exit(main())")
MODULE = (sys.executable, "-m", "creditaudit")


def _interrupted(command: tuple[str, ...], delay: float, out: str) -> subprocess.Popen:
    process = subprocess.Popen([*command, *TRAIN, "--out", out], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    return process


@pytest.mark.usefixtures("default_ctrl_c")
def test_ctrl_c_at_any_moment_of_the_start_is_one_line_and_130(tmp_path):
    """SIGINT at several moments of a start that takes a second or more (the interpreter's
    own first ~0.1 s, before the entry holds Ctrl-C, is left out, with a margin for a loaded
    machine): each while the package imports torch, parses or trains. The processes start
    one after the other and run side by side (the later each is interrupted the longer its
    own start ran)."""
    started = [_interrupted(command, delay, str(tmp_path / f"runs{i}")) for i, (command, delay)
               in enumerate([(SCRIPT, 0.4), (MODULE, 0.7), (SCRIPT, 1.0)])]
    for process in started:
        out, err = process.communicate(timeout=120)
        assert "Traceback" not in err, err
        assert process.returncode == 130, (process.returncode, err)
        assert len(err.splitlines()) == 1 and err.startswith(INTERRUPTED), err


@pytest.mark.usefixtures("default_ctrl_c")
def test_a_ctrl_c_held_while_starting_ends_the_command_with_one_line(capsys, monkeypatch):
    """In process: a SIGINT while the command starts (here: as it parses) is noted, the
    command is not run, and main() says so once and returns 130."""
    start = command.start

    def interrupted_start(argv):
        os.kill(os.getpid(), signal.SIGINT)
        return start(argv)

    monkeypatch.setattr(command, "start", interrupted_start)
    monkeypatch.setattr(command, "run", lambda args: pytest.fail("the command ran"))
    capsys.readouterr()
    assert main(["report", "nowhere"]) == 130
    assert capsys.readouterr().err == f"{INTERRUPTED}\n"


@pytest.mark.usefixtures("default_ctrl_c")
def test_a_ctrl_c_as_the_handler_is_put_back_is_one_line_too(capsys, monkeypatch):
    """A SIGINT arriving just as :func:`held_interrupts` puts Python's handler back, before
    the command's own handling takes over, raised a KeyboardInterrupt out of main() (a
    traceback): it ends in the one line and 130 too, and the command is not run."""
    put_back = signal.signal

    def signal_arriving_as_put_back(signum, handler):
        previous = put_back(signum, handler)
        if handler is signal.default_int_handler:
            os.kill(os.getpid(), signal.SIGINT)
        return previous

    monkeypatch.setattr(signal, "signal", signal_arriving_as_put_back)
    monkeypatch.setattr(command, "run", lambda args: pytest.fail("the command ran"))
    capsys.readouterr()
    try:
        code = main(["report", "nowhere"])
    except KeyboardInterrupt:
        pytest.fail("a KeyboardInterrupt came out of main()")
    assert code == 130
    assert capsys.readouterr().err == f"{INTERRUPTED}\n"


def test_a_sigterm_while_starting_ends_the_command_with_one_line_and_143():
    """A SIGTERM while the command starts (here: as it parses) ended the process without a
    word (killed by the signal) where docs/reliability.md promises the one line; it is held
    as a Ctrl-C is: the command is not run, and main() says so and returns 143. In a
    process of its own (on the code before, the signal killed it)."""
    code = ("import os, signal, sys\n"
            "from creditaudit.cli import command, main\n"
            "start = command.start\n"
            "def terminated_start(argv):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    return start(argv)\n"
            "command.start = terminated_start\n"
            "command.run = lambda args: sys.exit('the command ran')\n"
            "sys.exit(main(['report', 'nowhere']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stderr) == (143, f"{INTERRUPTED}\n")


def test_a_sigterm_as_the_hold_ends_is_one_line_and_143():
    """A SIGTERM arriving in the bytecodes between the start's hold putting SIGTERM's
    handler back (the default: the process dies) and the command's own handler
    (sigterm_interrupts, in run) killed the process without a word. main() now takes
    SIGTERM as the command does before the hold begins, so the hold hands it over with no
    gap: one line, 143, the command not run. In a process of its own (on the code before,
    the signal killed it: exit -15)."""
    code = ("import contextlib, os, signal, sys\n"
            "import creditaudit.cli as cli\n"
            "from creditaudit.cli import command, main\n"
            "hold = cli.held_interrupts\n"
            "@contextlib.contextmanager\n"
            "def hold_then_sigterm():\n"
            "    with hold() as interrupted:\n"
            "        yield interrupted\n"
            "    os.kill(os.getpid(), signal.SIGTERM)  # the hold has ended\n"
            "cli.held_interrupts = hold_then_sigterm\n"
            "command.run = lambda args: sys.exit('the command ran')\n"
            "sys.exit(main(['report', 'nowhere']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stderr) == (143, f"{INTERRUPTED}\n")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # this process's, untouched


@pytest.mark.usefixtures("default_ctrl_c")
def test_held_interrupts_notes_sigint_and_puts_the_handler_back():
    with held_interrupts() as interrupted:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100):  # the handler runs at the next bytecode; be generous
            if interrupted:
                break
    assert interrupted == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_of_the_caller_is_left_alone():
    def own(signum, frame):
        raise AssertionError("not called")

    previous = signal.signal(signal.SIGINT, own)
    try:
        with held_interrupts() as interrupted:
            assert signal.getsignal(signal.SIGINT) is own
        assert interrupted == []
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_entry_imports_neither_torch_nor_the_command():
    """What Ctrl-C can meet before :func:`main` holds it is the standard library's import:
    ``import creditaudit.cli`` (what the console script does first) loads no torch."""
    code = ("import sys, creditaudit.cli\n"
            "print(sorted(m for m in ('torch', 'numpy', 'creditaudit.cli.command', "
            "'creditaudit.config') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_command_s_names_are_read_from_the_entry_as_before():
    assert creditaudit.cli.build_parser().prog == "creditaudit"
    assert creditaudit.cli.CLOSED_STDOUT_EXIT == 141
    with pytest.raises(AttributeError, match="no attribute 'nothing_such'"):
        creditaudit.cli.nothing_such  # noqa: B018


def test_a_registry_asked_first_in_a_fresh_process_lists_its_built_ins():
    """``import creditaudit`` no longer imports the built-in components; a registry's
    listing (``classes()``, ``names()``: what docs/configuration.md's option tables are
    generated from) imports them itself. It listed plugins only."""
    code = ("from creditaudit.config import component_help\n"
            "from creditaudit.registry import ARCHITECTURES, DATASETS, DIAGNOSTICS, RULES\n"
            "print(all(r.names() for r in (RULES, ARCHITECTURES, DATASETS, DIAGNOSTICS)),\n"
            "      'mnist' in DATASETS.names(), len(component_help()) > 20)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]


def _as_type_checkers_read(path: Path) -> tuple[dict[str, str], list[ast.stmt]]:
    """What a type checker reads of the module at ``path``: (name → module of each name
    imported under TYPE_CHECKING, the top-level statements it sees — those under ``if not
    TYPE_CHECKING`` left out)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def checking(test: ast.expr) -> bool | None:  # True: TYPE_CHECKING, False: not it
        if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
            return True
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = checking(test.operand)
            return None if inner is None else not inner
        return None

    typed: dict[str, str] = {}
    seen_by_checkers = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If) and checking(node.test) is not None:
            seen_by_checkers.remove(node)
            if checking(node.test):
                seen_by_checkers.extend(node.body)
                typed.update({alias.name: str(imp.module) for imp in node.body
                              if isinstance(imp, ast.ImportFrom) for alias in imp.names})
    return typed, seen_by_checkers


def _functions(nodes: list[ast.stmt]) -> set[str]:
    return {node.name for node in nodes if isinstance(node, ast.FunctionDef)}


def test_type_checkers_read_the_package_s_names_as_imports():
    """What a type checker reads of ``creditaudit/__init__.py``: each name of ``__all__``
    imported under TYPE_CHECKING, from the module the lazy loader imports it from, and no
    module ``__getattr__``, which to a checker makes every attribute exist (typed Any):
    ``creditaudit.trian`` passed mypy, where it was an error before the names were lazy."""
    typed, seen_by_checkers = _as_type_checkers_read(Path(creditaudit.__file__))
    assert typed == creditaudit._PUBLIC
    assert set(creditaudit.__all__) == {*typed, "__version__"}
    assert "__getattr__" not in _functions(seen_by_checkers)


def test_type_checkers_read_the_command_s_names_in_the_entry_as_imports():
    """``creditaudit.cli`` reads the command's names (``build_parser``, ``CLOSED_STDOUT_EXIT``,
    …) from :mod:`creditaudit.cli.command` through a module ``__getattr__``, which type
    checkers saw: any attribute existed, typed Any, so ``creditaudit.cli.mian`` passed mypy
    silently. Checkers now read each public name the command defines as an import under
    TYPE_CHECKING, and no ``__getattr__``; each still resolves, at run time, to the
    command's own object, as the tests and docs use them."""
    typed, seen_by_checkers = _as_type_checkers_read(Path(creditaudit.cli.__file__))
    assert "__getattr__" not in _functions(seen_by_checkers)
    tree = ast.parse(Path(command.__file__).read_text(encoding="utf-8"))
    defined = {target.id for node in tree.body if isinstance(node, ast.Assign)
               for target in node.targets if isinstance(target, ast.Name)}
    defined |= {node.name for node in tree.body
                if isinstance(node, ast.FunctionDef | ast.ClassDef)}
    own = {name for name in _functions(seen_by_checkers) if not name.startswith("_")}
    own |= {"INTERRUPTED", "Terminated"}
    public = {name for name in defined if not name.startswith("_")} - own
    assert typed == dict.fromkeys(public, "creditaudit.cli.command")
    assert set(creditaudit.cli.__all__) == public | own
    for name in creditaudit.cli.__all__:
        assert getattr(creditaudit.cli, name) is (getattr(command, name) if name in public
                                                  else vars(creditaudit.cli)[name])
    with pytest.raises(AttributeError, match="has no attribute 'mian'"):
        creditaudit.cli.mian  # noqa: B018
