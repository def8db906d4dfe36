"""Labs: each lab is defined once, in its module here (``kvlab/labs/lNN_name.py``): its parameters (names, types, units,
rules), its quick-mode sizes, its exercise questions and its comparison plot. ``validate``, ``kvlab labs list/run/
collect``, the exercises and the solutions notebook all read that definition.

A lab notebook's ``parameters`` cell lists the same names and defaults (papermill needs it; a test checks they agree),
and its next cell calls ``validate_namespace``: every value is checked, papermill parameters the lab does not know are
refused, and quick mode's smaller sizes are applied *here*, so what is saved is what ran.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvlab.runtime import config
from kvlab.runtime.errors import KVLabError
from kvlab.runtime.model import max_context, resolve_model

LAB_DIR = config.REPO_ROOT / "labs"


@dataclass(frozen=True)
class Shrink:
    """How quick mode (``KVLAB_QUICK=1``) shrinks one parameter, with a few words saying how."""

    describe: str
    apply: Callable[[Any], Any]


def first(n: int) -> Shrink:
    """Quick mode keeps the first ``n`` items of a list."""
    return Shrink(f"first {n}", lambda v: v[:n])


def at_most(n: int) -> Shrink:
    """Quick mode caps a number at ``n``."""
    return Shrink(f"at most {n}", lambda v: min(v, n))


def first_middle_last() -> Shrink:
    """Quick mode keeps the first, the middle and the last item of a list (a sweep's shape, in three points)."""
    return Shrink("first, middle and last", lambda v: list(dict.fromkeys([v[0], v[len(v) // 2], v[-1]])))


def first_and_last() -> Shrink:
    """Quick mode keeps the first and the last item of a list (one if they are equal)."""
    return Shrink("first and last", lambda v: v[:1] + [x for x in v[-1:] if len(v) > 1 and x != v[0]])


@dataclass(frozen=True)
class Param:
    """One lab parameter: its name, default (which sets its type), what it is with its unit, and its rules."""

    name: str
    default: Any
    doc: str
    positive: bool = False  # every number (or list item) must be > 0
    fraction: bool = False  # 0 <= value <= 1
    between: tuple[float, float] | None = None  # inclusive
    choices: tuple[Any, ...] = ()  # allowed values
    quick: Shrink | None = None  # how quick mode shrinks it

    @property
    def type_name(self) -> str:
        return type(self.default).__name__

    def rules(self) -> str:
        """The rules as words, for ``kvlab labs list``."""
        out = []
        if self.positive:
            out.append("> 0")
        if self.fraction:
            out.append("0-1")
        if self.between:
            out.append(f"{self.between[0]:g}-{self.between[1]:g}")
        if self.choices:
            out.append("one of " + "/".join(map(str, self.choices)))
        if self.quick:
            out.append(f"quick mode: {self.quick.describe}")
        return "; ".join(out)


@dataclass(frozen=True)
class Lab:
    """Everything that defines a lab except its notebook: parameters, exercise questions, comparison plot."""

    name: str  # "L02_ttft_tpot_sweep": the notebook is labs/<name>.ipynb
    title: str
    about: str  # what it measures, in one line (kvlab labs list)
    params: tuple[Param, ...]
    questions: tuple[Any, ...] = ()  # kvlab.course.exercises.Question
    compare: Callable[[Any], Any] | None = None  # collected table with a 'run' column -> plotly figure
    check: Callable[[dict[str, Any]], str | None] | None = None  # rules across parameters: a problem's sentence, or None
    # the longest request these parameters make, in tokens, and what it is made of ("prefix_tokens + ..."): checked
    # against the model's context before anything starts
    longest: Callable[[dict[str, Any]], tuple[int, str]] | None = None

    @property
    def key(self) -> str:
        """The short name used by exercises: ``L02``."""
        return self.name[:3]

    @property
    def notebook(self) -> Path:
        return LAB_DIR / f"{self.name}.ipynb"

    @property
    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}


@dataclass
class Params:
    """A lab's validated parameters: ``ran`` (what this run uses: quick mode applied) and ``asked`` (what was given,
    defaults filled in). Attribute access reads ``ran``: ``p.prompt_lengths``."""

    lab: str
    ran: dict[str, Any]
    asked: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["ran"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def shrunk(self) -> dict[str, tuple[Any, Any]]:
        """{name: (asked, ran)} for every parameter quick mode changed."""
        return {k: (self.asked[k], v) for k, v in self.ran.items() if self.asked.get(k) != v}

    def metadata(self) -> dict[str, Any]:
        """What ``metadata.json`` records: the values that ran, and separately what was asked."""
        return {"parameters": self.ran, "parameters_asked": self.asked, "quick_mode": config.quick()}


# ---- the registry: one module per lab ------------------------------------------------------------------------------
def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name[:1] == "l" and m.name[1:3].isdigit())


def all_labs() -> list[Lab]:
    """Every lab, in order (L01, L02, …)."""
    return [importlib.import_module(f"{__name__}.{m}").LAB for m in _modules()]


def list_labs() -> list[str]:
    """Names of the labs, in order."""
    return [lab.name for lab in all_labs()]


def get(lab: str | Path) -> Lab:
    """A lab by name (``L02_ttft_tpot_sweep``), short name (``L02``) or notebook path."""
    key = Path(str(lab)).stem
    for spec in all_labs():
        if key in (spec.name, spec.key):
            return spec
    raise KVLabError(f"Unknown lab {str(lab)!r}; the labs are: {', '.join(list_labs())}.")


def lab_path(lab: str | Path) -> Path:
    """Path of a lab's notebook by name (``L01_capacity_planning``), short name or path."""
    path = Path(str(lab))
    if path.suffix == ".ipynb" and path.is_file():
        return path
    return get(lab).notebook


# ---- validation ----------------------------------------------------------------------------------------------------
def _type_ok(value: Any, default: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, list):
        if not isinstance(value, list) or not value:
            return False
        return not default or all(_type_ok(v, default[0]) for v in value)
    return isinstance(value, type(default))


def _unknown(lab: Lab, key: str) -> KVLabError:
    names = [p.name for p in lab.params]
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return KVLabError(f"Lab {lab.name} has no parameter {key!r}{hint}; its parameters are: {', '.join(names)}.")


def _check_rules(lab: Lab, p: Param, value: Any) -> None:
    items = value if isinstance(value, list) else [value]
    if p.positive:
        bad = [v for v in items if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0]
        if bad:
            raise KVLabError(f"Lab {lab.name}: parameter {p.name} must be positive, got {bad[0]!r}.")
    if p.fraction and not 0 <= value <= 1:
        raise KVLabError(f"Lab {lab.name}: parameter {p.name} must be a fraction between 0 and 1, got {value!r}.")
    if p.between and not p.between[0] <= value <= p.between[1]:
        low, high = p.between
        raise KVLabError(f"Lab {lab.name}: parameter {p.name} must be between {low:g} and {high:g}, got {value!r}.")
    if p.choices:
        bad = [v for v in items if v not in p.choices]
        if bad:
            raise KVLabError(f"Lab {lab.name}: parameter {p.name} must be one of {', '.join(map(repr, p.choices))}, got {bad[0]!r}.")


def validate(lab: str, given: Mapping[str, Any]) -> Params:
    """Check ``given`` ({name: value}) against the lab's definition — names, types, rules — before any work starts;
    fill in defaults and apply quick mode's sizes. Each problem is one sentence naming the lab and the parameter."""
    spec = get(lab)
    known = {p.name: p for p in spec.params}
    for key, value in given.items():
        if key not in known:
            raise _unknown(spec, key)
        default = known[key].default
        if not _type_ok(value, default):
            want = f"a non-empty list like {default!r}" if isinstance(default, list) else f"a {type(default).__name__} like {default!r}"
            if isinstance(value, str) and not isinstance(default, str):
                want += f" (on papermill's command line pass it as YAML: -y \"{key}: {default!r}\")"
            raise KVLabError(f"Lab {spec.name}: parameter {key}={value!r} should be {want}.")
    asked = spec.defaults | dict(given)
    for p in spec.params:
        _check_rules(spec, p, asked[p.name])
    problem = spec.check(asked) if spec.check else None
    if problem:
        raise KVLabError(f"Lab {spec.name}: {problem}")
    ran = dict(asked)
    if config.quick():
        for p in spec.params:
            if p.quick is not None:
                ran[p.name] = p.quick.apply(asked[p.name])
    _check_context(spec, ran)
    return Params(spec.name, ran, asked)


def _check_context(spec: Lab, ran: dict[str, Any]) -> None:
    """Refuse, before any engine starts, parameters whose longest request outgrows the model's context (a 2,048-token
    prompt for OPT's 2,048 positions); a model whose config cannot be read here is left to the engine to refuse."""
    if spec.longest is None:
        return

    try:
        limit = max_context(ran.get("model") or None)
    except Exception:  # noqa: BLE001 - an unknown or unreachable model: make_engine says so in one sentence
        return
    tokens, made_of = spec.longest(ran)
    if limit and tokens > limit:
        raise KVLabError(f"Lab {spec.name}: its longest request, {made_of} = {tokens:,} tokens, is longer than the "
                         f"model's context of {limit:,} tokens; lower them, or choose a model with a longer context.")


def tokenizer_of(ran: Mapping[str, Any]) -> Any:
    """The tokenizer of a lab's model, for a ``longest`` that counts the tokens its requests are made of."""
    from transformers import AutoTokenizer


    return AutoTokenizer.from_pretrained(resolve_model(ran.get("model") or None))


def injected_names(namespace: Mapping[str, Any]) -> list[str]:
    """Names papermill injected into this kernel (its cell starts with ``# Parameters``), read from IPython's input
    history ``In``: papermill itself only warns about names the notebook does not define, and runs on."""
    names: list[str] = []
    for source in namespace.get("In", []) or []:
        if isinstance(source, str) and source.lstrip().startswith("# Parameters"):
            try:
                tree = ast.parse(source)
            except SyntaxError:
                continue
            names += [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)]
    return names


def validate_namespace(lab: str, namespace: Mapping[str, Any]) -> Params:
    """``validate`` for a lab notebook: ``p = kvlab.labs.validate_namespace("L02_…", globals())``. Refuses names
    papermill injected that the lab does not know (a typo such as ``-p memroy_gib 24``), and prints what quick mode
    changed."""
    spec = get(lab)
    known = [p.name for p in spec.params]
    for name in injected_names(namespace):
        if name not in known:
            raise _unknown(spec, name)
    params = validate(spec.name, {k: namespace[k] for k in known if k in namespace})
    if params.shrunk:
        changes = ", ".join(f"{k}={ran!r} (asked {asked!r})" for k, (asked, ran) in params.shrunk.items())
        print(f"quick mode (KVLAB_QUICK=1) runs {changes}")
    return params


def notebook_parameters(lab: str) -> dict[str, dict[str, Any]]:
    """The lab notebook's cell tagged ``parameters``, read as {name: {default, doc}} (it must agree with the lab's
    definition; a test checks it)."""
    import nbformat

    nb = nbformat.read(lab_path(lab), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise KVLabError(f"Lab {lab!r} has {len(cells)} cells tagged 'parameters'; papermill needs exactly one.")
    lines = cells[0].source.splitlines()
    params: dict[str, dict[str, Any]] = {}
    for node in ast.parse(cells[0].source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            line = lines[node.lineno - 1]
            params[node.targets[0].id] = {"default": ast.literal_eval(node.value),
                                          "doc": line.split("#", 1)[1].strip() if "#" in line else ""}
    return params


def output_dir(lab: str, given: str = "") -> Path:
    """Where a lab writes: the given folder, or ``<build>/labs/<lab>``."""
    return Path(given).expanduser().resolve() if given else config.build_dir() / "labs" / get(lab).name


def model_param() -> Param:
    """The ``model`` parameter of every engine lab."""
    return Param("model", "", "Hugging Face id or local folder; empty: KVLAB_MODEL or the course model")


def output_param(lab: str) -> Param:
    """The ``output_dir`` parameter every lab ends with."""
    return Param("output_dir", "", f"where results go; empty: build/labs/{lab}")
