"""Lab exercises: questions a learner answers from their own run's numbers, and checks that say whether that reading
agrees with the data (not with a number printed in a book: every answer is computed from the results folder).

In a lab: ``kvlab.exercises.show("L02")`` lists the questions; ``kvlab.exercises.check({"L02.1": "prefill"}, out)``
checks answers against the results in ``out``. Instructors: ``solve("L02", folder)`` gives every answer with the
numbers behind it (``instructors/solutions.ipynb``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvlab.errors import KVLabError

Tables = dict[str, pd.DataFrame]


@dataclass(frozen=True)
class Question:
    """One question: its text, how to compute the answer (and a sentence of why) from a lab's tables."""

    qid: str
    text: str
    solve: Callable[[Tables], tuple[Any, str]]
    choices: tuple[str, ...] = ()  # empty: the answer is a number
    tolerance: float = 0.0  # numbers: relative tolerance (0 = exact)


def load(folder: str | Path) -> Tables:
    """A lab's results folder as tables: ``results`` plus every other CSV/Parquet (``summary``, ``dashboard``…)."""
    folder = Path(folder)
    if not (folder / "results.parquet").is_file() and not (folder / "results.csv").is_file():
        raise KVLabError(f"No results in {folder}: run the lab first (its Save cell writes them), or point at data/reference/cpu/<lab>.")
    tables: Tables = {}
    for f in sorted(folder.iterdir()):
        if f.suffix == ".parquet":
            tables[f.stem] = pd.read_parquet(f)
        elif f.suffix == ".csv" and f.stem not in tables and not (folder / f"{f.stem}.parquet").is_file():
            tables[f.stem] = pd.read_csv(f)
    return tables


def _p95(s: pd.Series) -> float:
    from kvlab.timing import p95

    return p95(s)


# ---- L01 · capacity planning -----------------------------------------------------------------------------------
def _l01_most(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    row = r[(r.memory_gib == r.memory_gib.max()) & (r.context == r.context.max())].iloc[0]
    return int(row.max_sequences), (f"{row.memory_gib:g} GiB at {int(row.context):,} tokens: {int(row.kv_tokens):,} KV tokens "
                                    f"÷ {int(row.context):,} per sequence → {int(row.max_sequences)} sequences")


def _l01_superlinear(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    ctx = r.context.min()
    small, big = r[(r.context == ctx) & (r.memory_gib == r.memory_gib.min())].iloc[0], r[(r.context == ctx) & (r.memory_gib == r.memory_gib.max())].iloc[0]
    mem_ratio = big.memory_gib / small.memory_gib
    seq_ratio = big.max_sequences / small.max_sequences if small.max_sequences else math.inf
    return ("yes" if seq_ratio > mem_ratio else "no"), (
        f"memory ×{mem_ratio:.2f}, sequences ×{seq_ratio:.2f} ({int(small.max_sequences)} → {int(big.max_sequences)}) at "
        f"{int(ctx):,} tokens: the weights take the same GiB on both cards, so all the extra memory goes to the KV cache")


# ---- L02 · TTFT/TPOT sweep --------------------------------------------------------------------------------------
def _l02_longest(t: Tables) -> pd.DataFrame:
    r = t["results"]
    return r[(r.prompt_tokens == r.prompt_tokens.max()) & (r.output_tokens == r.output_tokens.min())]


def _l02_phase(t: Tables) -> tuple[Any, str]:
    d = _l02_longest(t)
    ttft, decode = d.ttft_s.median(), d.decode_s.median()
    return ("prefill" if ttft > decode else "decode"), (
        f"at {int(d.prompt_tokens.iloc[0]):,} prompt tokens and {int(d.output_tokens.iloc[0])} output tokens: median TTFT "
        f"{ttft * 1e3:.0f} ms vs decode {decode * 1e3:.0f} ms")


def _l02_ttft_growth(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    m = r.groupby("prompt_tokens").ttft_s.median()
    ratio = m.iloc[-1] / m.iloc[0]
    return round(ratio, 2), f"median TTFT {m.iloc[0] * 1e3:.0f} ms at {m.index[0]:,} tokens → {m.iloc[-1] * 1e3:.0f} ms at {m.index[-1]:,}"


def _l02_tpot_vs_ttft(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    m = r.groupby("prompt_tokens")[["ttft_s", "tpot_s"]].median()
    g_ttft, g_tpot = m.ttft_s.iloc[-1] / m.ttft_s.iloc[0], m.tpot_s.iloc[-1] / m.tpot_s.iloc[0]
    return ("less" if g_tpot < g_ttft else "more"), (
        f"TPOT ×{g_tpot:.2f} vs TTFT ×{g_ttft:.2f}: decode reads the weights once per token whatever the prompt; prefill "
        "does work proportional to the prompt")


# ---- L03 · prefix cache delta -----------------------------------------------------------------------------------
def _l03_saved(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    shared = r[r.label.str.contains("shared")]
    on, off = shared[shared.caching == "on"].ttft_s.median(), shared[shared.caching == "off"].ttft_s.median()
    return round((off - on) * 1e3, 1), f"shared-prefix requests: median TTFT {off * 1e3:.0f} ms without caching, {on * 1e3:.0f} ms with"


def _l03_who(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    gains = {}
    for kind in ("shared", "unique"):
        k = r[r.label.str.contains(kind)]
        gains[kind] = k[k.caching == "on"].ttft_s.median() / k[k.caching == "off"].ttft_s.median()
    winners = [k for k, g in gains.items() if g < 0.8]
    answer = "both" if len(winners) == 2 else (winners[0] if winners else "neither")
    return answer, ", ".join(f"{k}: TTFT with ÷ without = {g:.2f}" for k, g in gains.items()) + " (a gain means below 0.8)"


# ---- L04 · chunked prefill --------------------------------------------------------------------------------------
def _l04_smallest_stall(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    best = r.loc[r.decoder_itl_max_ms.idxmin()]
    return str(best.config), ", ".join(f"{c}: {v:.0f} ms" for c, v in zip(r.config, r.decoder_itl_max_ms, strict=True))


def _l04_cost(t: Tables) -> tuple[Any, str]:
    r = t["results"].set_index("config")
    off = r.long_ttft_ms["chunked off"]
    chunked = r.drop(index="chunked off")
    smallest = chunked.max_num_batched_tokens.idxmin()
    ratio = chunked.long_ttft_ms[smallest] / off
    return ("yes" if ratio > 1.1 else "no"), (
        f"long prompt TTFT {off:.0f} ms with chunked prefill off vs {chunked.long_ttft_ms[smallest]:.0f} ms with {smallest} "
        f"(×{ratio:.2f})")


# ---- L05 · batch sweep ------------------------------------------------------------------------------------------
def _l05_best_batch(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    tpot = r.groupby("batch_size").tpot_s.median()
    tput = tpot.index.to_series() / tpot
    best = int(tput.idxmax())
    return best, ", ".join(f"batch {b}: {v:.0f} tok/s" for b, v in tput.items()) + " (decode throughput = batch ÷ median TPOT)"


def _l05_ttft_growth(t: Tables) -> tuple[Any, str]:
    m = t["results"].groupby("batch_size").ttft_s.median()
    return round(m.iloc[-1] / m.iloc[0], 2), f"median TTFT {m.iloc[0] * 1e3:.0f} ms at batch {m.index[0]} → {m.iloc[-1] * 1e3:.0f} ms at {m.index[-1]}"


# ---- L06 · traffic mix ------------------------------------------------------------------------------------------
def _l06_p95(t: Tables) -> tuple[Any, str]:
    r = t["results"]
    chat, mixed = _p95(r[r.mix == "chat only"].ttft_s), _p95(r[r.mix == "chat + agents"].ttft_s)
    return round(mixed / chat, 2), f"TTFT p95 {chat * 1e3:.0f} ms (chat only) → {mixed * 1e3:.0f} ms (chat + agents)"


def _l06_kind(t: Tables) -> tuple[Any, str]:
    m = t["results"][lambda d: d.mix == "chat + agents"].groupby("kind").ttft_s.median()
    return str(m.idxmax()), ", ".join(f"{k}: median TTFT {v * 1e3:.0f} ms" for k, v in m.items())


def _l06_tps(t: Tables) -> tuple[Any, str]:
    s = t["summary"].set_index("mix")["output tokens/s (mean)"]
    change = abs(s["chat + agents"] / s["chat only"] - 1)
    return ("yes" if change > 0.2 else "no"), f"output tokens/s {s['chat only']:.1f} vs {s['chat + agents']:.1f} ({change:.0%} apart)"


QUESTIONS: dict[str, list[Question]] = {
    "L01": [
        Question("L01.1", "How many sequences fit on the largest card at the longest context?", _l01_most),
        Question("L01.2", "From the smallest to the largest card (shortest context), do the sequences that fit grow by more "
                          "than the memory does? (yes/no)", _l01_superlinear, ("yes", "no")),
    ],
    "L02": [
        Question("L02.1", "At the longest prompt (shortest output), which phase takes longer: prefill or decode?", _l02_phase,
                 ("prefill", "decode")),
        Question("L02.2", "How many times larger is the median TTFT at the longest prompt than at the shortest? (±25 %)",
                 _l02_ttft_growth, tolerance=0.25),
        Question("L02.3", "From the shortest to the longest prompt, does TPOT grow less or more than TTFT? (less/more)",
                 _l02_tpot_vs_ttft, ("less", "more")),
    ],
    "L03": [
        Question("L03.1", "How many milliseconds of median TTFT did prefix caching save the shared-prefix requests? (±25 %)",
                 _l03_saved, tolerance=0.25),
        Question("L03.2", "Which requests gained from caching: shared, unique, both or neither?", _l03_who,
                 ("shared", "unique", "both", "neither")),
    ],
    "L04": [
        Question("L04.1", "Which configuration gave the decoders the smallest worst gap? (its name in the `config` column)",
                 _l04_smallest_stall),
        Question("L04.2", "Did the smallest chunk budget delay the long prompt's TTFT by more than 10 % against chunked "
                          "prefill off? (yes/no)", _l04_cost, ("yes", "no")),
    ],
    "L05": [
        Question("L05.1", "At which batch size was decode throughput highest?", _l05_best_batch),
        Question("L05.2", "How many times larger is the median TTFT at the largest batch than at the smallest? (±25 %)",
                 _l05_ttft_growth, tolerance=0.25),
    ],
    "L06": [
        Question("L06.1", "By what factor did TTFT p95 grow when agents joined the traffic? (±25 %)", _l06_p95, tolerance=0.25),
        Question("L06.2", "In the mixed run, which kind of request had the higher median TTFT: chat or agent?", _l06_kind,
                 ("chat", "agent")),
        Question("L06.3", "Did mean output tokens/s differ by more than 20 % between the two mixes? (yes/no)", _l06_tps,
                 ("yes", "no")),
    ],
}


def questions(lab: str) -> list[Question]:
    """The questions of a lab (``"L02"`` or ``"L02_ttft_tpot_sweep"``)."""
    key = lab[:3]
    if key not in QUESTIONS:
        raise KVLabError(f"No exercises for {lab!r}; labs with exercises: {', '.join(QUESTIONS)}.")
    return QUESTIONS[key]


def show(lab: str) -> Any:
    """The lab's questions as Markdown, with the key to use for each answer."""
    from IPython.display import Markdown

    lines = [f"{i}. **`{q.qid}`** — {q.text}" + (f" Choices: {', '.join(q.choices)}." if q.choices else "")
             for i, q in enumerate(questions(lab), start=1)]
    return Markdown("\n".join(lines))


def _agrees(q: Question, given: Any, expected: Any) -> bool:
    if q.choices or isinstance(expected, str):
        return str(given).strip().lower() == str(expected).strip().lower()
    if not isinstance(given, (int, float)) or isinstance(given, bool):
        return False
    if q.tolerance == 0:
        return given == expected
    return abs(given - expected) <= q.tolerance * abs(expected)


def check(answers: dict[str, Any], folder: str | Path) -> pd.DataFrame:
    """Check answers ({question id: answer}; None = not answered yet) against the results in ``folder``. A wrong
    answer gets the numbers to look at, not the answer."""
    tables = load(folder)
    lab = next(iter(answers))[:3] if answers else ""
    rows = []
    for q in questions(lab):
        given = answers.get(q.qid)
        if given is None:
            rows.append({"question": q.qid, "your answer": "", "verdict": "not answered yet"})
            continue
        if q.choices and str(given).strip().lower() not in q.choices:
            rows.append({"question": q.qid, "your answer": given, "verdict": f"answer one of: {', '.join(q.choices)}"})
            continue
        expected, _ = q.solve(tables)
        ok = _agrees(q, given, expected)
        rows.append({"question": q.qid, "your answer": given,
                     "verdict": "✓ consistent with your data" if ok else "✗ not what your data says: look again at the table above"})
    return pd.DataFrame(rows)


def solve(lab: str, folder: str | Path) -> pd.DataFrame:
    """Every answer of a lab computed from the results in ``folder``, with the numbers behind it (instructors)."""
    tables = load(folder)
    rows = []
    for q in questions(lab):
        answer, why = q.solve(tables)
        rows.append({"question": q.qid, "text": q.text, "answer": answer, "from the data": why})
    return pd.DataFrame(rows)
