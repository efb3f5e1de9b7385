"""Imports flow one way: each package imports only the packages below it in PACKAGES, no module imports itself
through others, and an import sits inside a function only for an optional dependency or a slow-to-import third-party
module. README.md's package map is PACKAGES rendered (a test compares them)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from mle_jax.infra.class_registry import ClassRegistry

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mle_jax"
# Dependencies a module may import inside a function: optional extras, or code that only runs in another
# interpreter (the vLLM worker runs inside the vLLM server's venv).
OPTIONAL = {
    "docker",
    "ray",
    "torch",
    "requests",
    "urllib3",
    "gguf",
    "safetensors",
    "vllm",
    "tensorstore",
    "jax.experimental.topologies",
}
# Third-party modules slow to import that only some code paths use, imported where they are used so that a process
# which never needs them (the launcher, the evaluate CLI, the planner, each test's subprocess) starts ~3 s of CPU
# sooner: tensorboardX and transformers' Auto classes import torch, matplotlib, scipy.stats and sklearn ~1 s each.
# Never a module of mle_jax: an inner import must not hide a cycle.
HEAVY = {
    "tensorboardX",
    "transformers",
    "matplotlib",
    "scipy.stats",
    "sklearn.model_selection",
}


# The packages of mle_jax, highest first, with why each exists: a package may import only those below it. The
# entry points (launch, evaluate, plan) sit above them all.
PACKAGES: tuple[tuple[str, str], ...] = (
    (
        "experiments",
        "the learning, duration-bias, PPO-epochs and task-mix experiments: runs of runs, with their reports",
    ),
    ("planner", "the run's update and decode compiled for GPU/TPU targets that need not be here: memory, FLOPs, time"),
    ("run", "a run's wiring: the config read once into settings, builders, environment assembly, preflight, stages"),
    ("reporting", "what people read: report.md and plots, markdown tables, README/BUILD tables, provenance"),
    ("warmstart", "the verified SFT corpus (a grid of programs per task) and the SFT stage for models from scratch"),
    ("rl", "the algorithm only: objectives, advantages, group statistics, the learner, the update, the async loop"),
    ("env", "the agent's environment: prompts -> sampler -> instrumenter -> executor -> grader -> reward; evaluation"),
    ("executor", "sandbox backends (bwrap, Docker/Podman) and fleets (local pool, Ray) running untrusted code"),
    ("instrument", "progress prints by a frozen LM, their verification, the AST fallback, the tags"),
    ("sampling", "the Sampler protocol, the in-process JAX sampler, the vLLM server and its client with weight sync"),
    (
        "kernels",
        "the JAX sampler's decode step on CPU as XLA FFI custom calls (C++, built by make), plugged into "
        "the model's one seam, models/ops",
    ),
    ("models", "Flax NNX Qwen2, the critic, HF safetensors and GGUF weights, tokenizers; the ops seam"),
    ("tasks", "the twelve tasks: MLE-bench folders, preparers, graders, prompts, reward, medals"),
    ("infra", "leaves that know nothing of RL: meshes and shardings, checkpoints, the optimizer, the metrics writer"),
)
ENTRY_POINTS = ("launch", "evaluate", "plan")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def resolve(name: str, known: set[str]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imported(node: ast.Import | ast.ImportFrom, current: str, is_package: bool, known: set[str]) -> list[str]:
    """Module names (within mle_jax) an import statement loads."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = current.split(".")
            keep = len(parts) - node.level + (1 if is_package else 0)
            base = ".".join(parts[:keep] + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    return [m for m in (resolve(n, known) for n in names) if m]


def graph(with_typing: bool = True) -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """(module -> modules it imports, [(module, line, statement) of imports inside functions]). with_typing False:
    without the imports under `if TYPE_CHECKING:` (never executed: they order packages but load nothing)."""
    mods = modules()
    known = set(mods)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    inner = []
    for m, path in mods.items():
        tree = ast.parse(path.read_text())
        in_function = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            for n in ast.walk(f)
            if isinstance(n, ast.Import | ast.ImportFrom)
        }
        for_typing = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.If) and ast.unparse(f.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for n in ast.walk(f)
            if isinstance(n, ast.Import | ast.ImportFrom)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            if not with_typing and id(node) in for_typing:
                continue
            edges[m].update(t for t in imported(node, m, path.name == "__init__.py", known) if t != m)
            if id(node) in in_function:
                inner.append((m, node.lineno, ast.unparse(node)))
    return edges, inner


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_module_imports_itself_through_others():
    """No circle of imports that run (a type annotation's import under TYPE_CHECKING loads nothing: rl/objectives
    names the PPOSettings that rl/settings, which validates the algorithm against the objectives, defines)."""
    assert cycles(graph(with_typing=False)[0]) == []


def package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Module edges -> package edges (short names: "rl", "launch")."""
    packages: dict[str, set[str]] = {}
    for a, targets in edges.items():
        for b in targets:
            pa, pb = package_of(a).removeprefix("mle_jax."), package_of(b).removeprefix("mle_jax.")
            if pa != pb and pb != "mle_jax":
                packages.setdefault(pa, set()).add(pb)
    return packages


def upward_imports(packages: dict[str, set[str]]) -> list[str]:
    """Package edges that break PACKAGES' order ("rl -> run"), and packages PACKAGES does not name."""
    rank = {name: len(PACKAGES) - i for i, (name, _) in enumerate(PACKAGES)}
    rank.update({e: len(PACKAGES) + 1 for e in ENTRY_POINTS})
    bad = [
        f"{p}: not in PACKAGES"
        for p in sorted(set(packages) | {b for t in packages.values() for b in t})
        if p not in rank
    ]
    bad += [
        f"{a} -> {b}"
        for a, ts in sorted(packages.items())
        for b in sorted(ts)
        if a in rank and b in rank and rank[a] <= rank[b]
    ]
    return bad


def test_no_two_packages_import_each_other():
    assert cycles(package_edges(graph()[0])) == []


def test_each_package_imports_only_the_packages_below_it():
    assert upward_imports(package_edges(graph()[0])) == []


def test_every_package_is_named_in_the_order_and_the_top_holds_only_the_entry_points():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert top == sorted(ENTRY_POINTS)
    folders = sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))
    assert folders == sorted(name for name, _ in PACKAGES)


@pytest.mark.parametrize(
    "edge, expected",
    [(("rl", "run"), ["rl -> run"]), (("infra", "tasks"), ["infra -> tasks"]), (("run", "rl"), []),
     (("launch", "run"), []), (("rl", "nowhere"), ["nowhere: not in PACKAGES"])],
)  # fmt: skip
def test_the_order_check_finds_an_upward_import(edge, expected):
    a, b = edge
    assert upward_imports({a: {b}}) == expected


def package_map() -> str:
    """README.md's package map: PACKAGES as a table, highest first."""
    rows = [f"| `{e}.py` | a command-line entry point |" for e in ENTRY_POINTS]
    rows += [f"| `{name}/` | {why} |" for name, why in PACKAGES]
    return "\n".join(["| package (highest first) | why it exists |", "|---|---|", *rows])


def test_the_readme_package_map_is_the_order_the_tests_check():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- package-map -->\n", 1)[-1].split("\n<!-- /package-map -->", 1)[0]
    assert block == package_map(), "README.md's package map differs; the block to paste:\n" + package_map()


def registries() -> list[tuple[str, ClassRegistry]]:
    """(module, registry) of every ClassRegistry a `registry` module of mle_jax holds."""
    named = [m for m in sorted(modules()) if m.rsplit(".", 1)[-1] == "registry"]
    return [(m, v) for m in named for v in vars(importlib.import_module(m)).values() if isinstance(v, ClassRegistry)]


def registry_problems(module: str, registry: ClassRegistry) -> list[str]:
    """The entries of `registry` (held by `module`) that name a module outside its package and the packages below it
    (an import the graph above cannot see: importlib makes it), or a class whose `name` is not its key."""
    rank = {name: len(PACKAGES) - i for i, (name, _) in enumerate(PACKAGES)}
    own = package_of(module).removeprefix("mle_jax.")
    known = set(modules())
    bad = []
    for name, path in registry.paths().items():
        target = path.partition(":")[0]
        where = package_of(target).removeprefix("mle_jax.")
        if target not in known or where not in rank:
            bad.append(f"{module} {name}: {target} is not a module of a package of mle_jax")
        elif where != own and rank[where] >= rank[own]:
            bad.append(f"{module} {name}: {target} is in {where}, not in {own} or a package below it")
        else:
            try:
                registry.resolve(name)
            except (TypeError, AttributeError) as e:
                bad.append(f"{module} {name}: {e}")
    return bad


def test_every_registry_entry_is_a_class_of_its_package_or_below_under_its_own_name():
    found = registries()
    assert {"mle_jax.executor.registry", "mle_jax.sampling.registry"} <= {m for m, _ in found}
    assert [p for m, r in found for p in registry_problems(m, r)] == []


@pytest.mark.parametrize(
    "path, says",
    [("mle_jax.run.builders:make_sampler", "is in run, not in executor or a package below it"),
     ("mle_jax.executor.nowhere:Sandbox", "is not a module of a package of mle_jax"),
     ("mle_jax.executor.docker:DockerSandbox", "its name is 'docker'"),
     ("mle_jax.executor.bwrap:NoSuchClass", "has no attribute 'NoSuchClass'")],
)  # fmt: skip
def test_the_registry_check_finds_a_bad_entry(path, says):
    [problem] = registry_problems("mle_jax.executor.registry", ClassRegistry("executor.backend", {"bwrap": path}))
    assert says in problem, problem


def test_imports_inside_functions_are_optional_dependencies():
    _, inner = graph()
    bad = []
    for module, line, stmt in inner:
        node = ast.parse(stmt).body[0]
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        if not all(any(n == o or n.startswith(o + ".") for o in OPTIONAL | HEAVY) for n in names):
            bad.append(f"{module}:{line}: {stmt}")
    assert bad == []


@pytest.mark.parametrize(
    "edges, expected",
    [({"a": {"b"}, "b": {"a"}}, [["a", "b"]]), ({"a": {"b"}, "b": {"c"}, "c": set()}, [])],
)
def test_the_cycle_finder_finds_cycles(edges, expected):
    assert cycles(edges) == expected


def test_nothing_reads_the_team_folder_beside_the_repository():
    """A user's clone has no ../shared: code, configs, tests, benchmarks and scripts read data/raw/ instead."""
    patterns = ("../shared", 'parent / "shared"', "MLE_JAX_SHARED")
    files = [
        p for d in ("mle_jax", "configs", "tests", "bench", "launch") for p in (ROOT / d).rglob("*") if p.is_file()
    ]
    files += [ROOT / "Makefile", ROOT / "pyproject.toml"]
    hits = [
        str(p.relative_to(ROOT))
        for p in files
        if p.suffix in (".py", ".sh", ".toml", "")
        and p != Path(__file__)
        and any(s in p.read_text(errors="ignore") for s in patterns)
    ]
    assert hits == []


def test_the_command_line_entry_points_start_without_the_heavy_modules():
    """The launcher, the evaluate CLI and the planner import none of HEAVY's slow modules (nor torch) at start-up:
    the suite starts dozens of them, and each would pay ~3 s of CPU more."""
    heavy = sorted({"torch", "matplotlib", "sklearn", *HEAVY} - {"transformers"})  # PreTrainedTokenizerFast is used
    code = (
        "import sys; import mle_jax.launch, mle_jax.evaluate, mle_jax.plan; "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


# What the planner may load of the packages that run the agent: their settings, results and name registries. It
# compiles the real update (rl.learner, rl.update) and the models, but reads a config without the RL loop, the
# rollouts, the warm-start stage, the samplers or the sandboxes.
PLANNER_MAY_LOAD = frozenset(
    {
        "mle_jax.executor",
        "mle_jax.executor.settings",
        "mle_jax.executor.result",
        "mle_jax.executor.registry",
        "mle_jax.sampling",
        "mle_jax.sampling.protocol",
        "mle_jax.sampling.registry",
    }
)
PLANNER_MUST_NOT_LOAD = ("mle_jax.rl.loop", "mle_jax.rl.hosts", "mle_jax.env.rollout", "mle_jax.warmstart.stage")


def planner_offenders(loaded: list[str]) -> list[str]:
    """The modules of `loaded` that `import mle_jax.plan` must not load."""
    runtime = ("mle_jax.executor.", "mle_jax.sampling.")
    return sorted(
        m for m in loaded if m in PLANNER_MUST_NOT_LOAD or (m.startswith(runtime) and m not in PLANNER_MAY_LOAD)
    )


def test_the_planner_loads_no_rl_loop_sampler_or_executor():
    """`python -m mle_jax.plan` runs where there is no sandbox, sampler or run: it imports the settings of those
    packages (their own light modules), never the machinery."""
    code = "import sys; import mle_jax.plan; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    offenders = planner_offenders(done.stdout.split())
    assert offenders == [], f"import mle_jax.plan loads {offenders}"


def test_every_python_dash_m_command_in_the_docs_and_scripts_names_a_module_that_exists():
    """Modules move between packages: every `python -m mle_jax...` (or `tests...`) that README.md, BUILD.md, the
    Makefile, launch/ and .ci/ tell a person to run must name a module that is there."""
    import importlib.util
    import re

    places = [
        ROOT / "README.md",
        ROOT / "BUILD.md",
        ROOT / "Makefile",
        *(ROOT / "launch").glob("*.sh"),
        ROOT / ".ci/run",
    ]
    places += list((ROOT / "docs").glob("*.md"))
    named = {
        m.rstrip(".")
        for p in places
        for m in re.findall(r"python[\d.]* -m ((?:mle_jax|tests)[\w.]*)", p.read_text())
        if not m.endswith("..")
    }
    assert "mle_jax.launch" in named and "mle_jax.reporting.results_tables" in named
    assert [m for m in sorted(named) if importlib.util.find_spec(m) is None] == []


def test_the_tests_mirror_the_packages():
    """Each package's tests are in tests/<package>/; the top of tests/ keeps the CLIs' and the end-to-end tiers' (at
    most 10 test modules)."""
    tests = ROOT / "tests"
    missing = [name for name, _ in PACKAGES if not list((tests / name).glob("test_*.py"))]
    assert missing == []
    top = sorted(p.name for p in tests.glob("test_*.py"))
    assert len(top) <= 10, top


def test_no_module_is_over_600_lines():
    """The house's limit: a module past it holds more than one concept (models/qwen2.py was 739 lines with the CPU
    kernels' hooks, rl/loop.py 667 with the step's statistics)."""
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}
