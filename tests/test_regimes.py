"""The regime matrix (benchmarks/regimes) in a CI-sized run: two of its quickest cells,
one seed, on the test split. Asserted only what holds with margin there: CoBo with every
key at its default beats Local and the weights its pull reads stay inside the client's
cluster (the first defaults lost to Local on both cells)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load(name: str):
    """The suite's modules by path: benchmarks/fidelity has a run.py and a report.py too."""
    spec = importlib.util.spec_from_file_location(
        f"regimes_{name}", REPO / "benchmarks" / "regimes" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


report = _load("report")
regimes = report.sibling("run")


@pytest.fixture(scope="module")
def rows():
    cells = {c["id"]: c for c in regimes.load_cells()}
    entries = {"local": ("local", {}), "oracle": ("oracle", {}), "cobo": ("cobo", {})}
    jobs = regimes.plan_jobs(
        [cells["quad-2to10"], cells["digits-8-r100"]], entries, [0], "test", {}
    )
    return [regimes.run_one(j) for j in jobs]


def test_cobo_defaults_beat_local_with_the_clusters_found(rows):
    table = report.summarize(rows)
    for cell in ("quad-2to10", "digits-8-r100"):
        cobo = table[cell]["cobo"]
        assert not cobo["diverged"]
        # seed 0 measured: 0.94 and 0.30 (digits' seed 0 pulls one pair across the
        # clusters from round 0's scores, W across 0.04; round 0 at the sampler's rate, as
        # raycobo 0.3: 0.89 and 0.80)
        assert cobo["gap"] > 0.2, (cell, cobo)
        # measured 1.00 and 0.96
        assert cobo["mass_pulled"] > 0.9, (cell, cobo)
        # the whole W too, weights below the pull's threshold included (fade): seed 0
        # measured 1.00 and 0.96 (raycobo 0.3: 0.96-1.00 over six seeds; without fade
        # 0.89-0.99)
        assert cobo["mass_inside"] > 0.9, (cell, cobo)


def test_the_report_reads_the_matrix(rows, tmp_path):
    table = report.summarize(rows)
    text = report.markdown(table, ["cobo"])
    assert "| quad-2to10 |" in text and "| digits-8-r100 |" in text
    v = report.verdict(table, "cobo")
    assert v["cells"] == 2 and v["below_local"] == [] and v["diverged"] == []
    ratios = [table[c]["cobo"]["seconds"] / table[c]["local"]["seconds"] for c in table]
    assert v["median_cost"] == sum(ratios) / 2  # the median of two cells' time over Local's
    for cell, ratio in zip(table, ratios, strict=True):  # each cell's own, in its row
        line = next(x for x in text.splitlines() if x.startswith(f"| {cell} "))
        assert line.endswith(f", {ratio:.1f}× time |")
    out = tmp_path / "FIDELITY.md"
    out.write_text("# Fidelity\n\nclaims\n")
    report.write_block(out, "## table\n" + text)
    report.write_block(out, "## table again\n" + text)  # replaced, not appended twice
    body = out.read_text()
    assert body.count("<!-- regimes:start -->") == 1 and "table again" in body
    assert body.startswith("# Fid")
    report.write_block(out, "## methods\n" + text, "regimes-methods")  # a block of its own
    body = out.read_text()
    assert body.count("<!-- regimes:start -->") == 1 and "## methods" in body
    assert body.index("table again") < body.index("<!-- regimes-methods:start -->")
    assert report.plot(table, ["cobo"], tmp_path / "p.png").stat().st_size > 0


def test_the_scaling_table_reads_n_from_the_cells(tmp_path):
    """The cross-device cells by client count: n from the partition, seconds per round
    from the run's wall time over the cell's rounds (CPU rows only), where each ran,
    and the plot against n."""
    cells = {c["id"]: c for c in regimes.load_cells()}
    assert report.clients(cells["fmnist-160"]) == 160 and report.clients(cells["quad-2x2"]) == 4
    assert report.clients(cells["fmnist-16-groups"]) == 32  # 4 groups (the default) x 8
    rows = [
        {"cell": "fmnist-160", "entry": e, "seed": 0, "accuracy": a, "loss": 1.0,
         "diverged": False, "seconds": 300.0, "mass_inside": 0.8, "mass_pulled_inside": 0.99,
         "w_within": 0.7, "w_across": 0.01}
        for e, a in (("local", 0.5), ("oracle", 0.7), ("cobo", 0.68))
    ]  # fmt: skip
    gpu = [
        dict(r, cell="fmnist-800-r5000", device="cuda", seconds=100.0) for r in rows
    ]  # a GPU call's rows: several runs shared the GPU, so their wall time is no timing
    text = report.scaling(report.summarize(rows + gpu))
    same = "| 50.0 | 70.0 | 68.0 | 90 % | 0.70 / 0.010 | 0.99 |"
    assert f"| 160 | fmnist-160 | 3000 {same} 0.100 | cpu |" in text
    assert f"| 800 | fmnist-800-r5000 | 5000 {same} - | cuda |" in text
    assert report.plot_scaling(report.summarize(rows), ["cobo"], tmp_path / "s.png").stat().st_size


def test_the_verdict_names_the_cells_short_of_each_target():
    """Cells under 75 % of the gap (not hidden by rounding: 74.6 % is short) and cells
    whose W holds under 0.9 of a row's mass inside the cluster, both among the weights
    the pull reads and in the whole of W, are named; a cell with Oracle - Local under 3
    points counts for none of them."""

    def run(cell, entry, acc, whole=0.95, pulled=0.99):
        return {"cell": cell, "entry": entry, "seed": 0, "accuracy": acc, "loss": 1.0,
                "diverged": False, "seconds": 1.0, "mass_inside": whole,
                "mass_pulled_inside": pulled, "w_within": 0.7, "w_across": 0.01}  # fmt: skip

    rows = [run(c, e, a) for c in ("fmnist-160", "mnist1d-16", "fmnist-16-groups")
            for e, a in (("local", 0.50), ("oracle", 0.60))]  # fmt: skip
    rows += [
        run("fmnist-160", "cobo", 0.59, whole=0.70),  # 90 %, only the whole W short
        run("mnist1d-16", "cobo", 0.5746, pulled=0.85),  # 74.6 %, the pulled mass short
        run("fmnist-16-groups", "cobo", 0.51, whole=0.5, pulled=0.5),
    ]
    table = report.summarize(rows)
    table["fmnist-16-groups"]["oracle"]["score"] = 0.52  # gap < 3 points: not counted
    table["fmnist-16-groups"]["cobo"]["gap"] = 0.1
    v = report.verdict(table, "cobo")
    assert v["cells"] == 2 and v["below_local"] == []
    assert v["below_0.75"] == ["mnist1d-16"]
    assert v["mass_below_0.9"] == ["mnist1d-16"]
    assert v["whole_mass_below_0.9"] == ["fmnist-160"]


def test_the_verdict_names_the_cells_over_twice_locals_time_with_papers():
    """A cell where the entry's run takes over 2x Local's time (as the table rounds it)
    is named with its ratio, and with Algorithm 1's (``paper``) on the same cell where
    asked."""

    def run(cell, entry, seconds):
        return {"cell": cell, "entry": entry, "seed": 0, "accuracy": 0.55, "loss": 1.0,
                "diverged": False, "seconds": seconds, "mass_inside": 1.0,
                "mass_pulled_inside": 1.0, "w_within": 0.7, "w_across": 0.01}  # fmt: skip

    rows = [run(c, e, 10.0) for c in ("fmnist-160", "mnist1d-16") for e in ("local", "oracle")]
    rows = [dict(r, accuracy=0.5 if r["entry"] == "local" else 0.6) for r in rows]
    rows += [run("fmnist-160", "cobo", 27.0), run("fmnist-160", "paper", 22.0)]
    rows += [run("mnist1d-16", "cobo", 20.4), run("mnist1d-16", "paper", 30.0)]
    table = report.summarize(rows)
    assert report.verdict(table, "cobo", "paper")["over_cost_bar"] == [("fmnist-160", 2.7, 2.2)]
    assert report.verdict(table, "cobo")["over_cost_bar"] == [("fmnist-160", 2.7, None)]
    assert [c for c, *_ in report.verdict(table, "paper")["over_cost_bar"]] == [
        "fmnist-160",
        "mnist1d-16",
    ]
    assert report._dear(report.verdict(table, "cobo", "paper")["over_cost_bar"], "paper") == (
        "fmnist-160 2.7× (paper 2.2×)"
    )


def test_gpu_cells_and_devices_are_chosen_explicitly():
    """Cells marked ``gpu`` run only when named or on a GPU; ``--device`` and
    ``--data-root`` reach the runs' configs (not the generated data sets' roots)."""
    cells = {c["id"]: c for c in regimes.load_cells()}
    gpu = {i for i, c in cells.items() if c.get("gpu")}
    assert {"fmnist-800-r5000", "fmnist-1600-r2000"} <= gpu
    listed = regimes.load_cells()
    on_cpu = {c["id"] for c in regimes.select_cells(listed, "", False, "cpu")}
    assert not on_cpu & gpu and "fmnist-800-r1000" in on_cpu
    assert gpu <= {c["id"] for c in regimes.select_cells(listed, "", False, "cuda")}
    named = regimes.select_cells(listed, "fmnist-800-r5000,quad-2x2", False, "cpu")
    assert [c["id"] for c in named] == ["quad-2x2", "fmnist-800-r5000"]  # the file's order
    with pytest.raises(KeyError, match="nope"):
        regimes.select_cells(listed, "quad-2x2,nope", False, "cpu")
    assert report.clients(cells["fmnist-1600-r2000"]) == 1600
    cfg = regimes.cell_config(cells["fmnist-800-r5000"], "test", 1, "cuda", "/data/fm")
    assert (cfg["rounds"], cfg["seed"], cfg["engine"]["device"]) == (5000, 1, "cuda")
    assert cfg["data"]["root"] == "/data/fm"
    quad = regimes.cell_config(cells["quad-2x2"], "test", 0, "cpu", "/data/fm")
    assert "root" not in quad["data"] and "engine" not in quad
    job = regimes.plan_jobs([cells["quad-2x2"]], {"cobo": ("cobo", {})}, [0], "test", {},
                            device="cuda", data_root="/d")[0]  # fmt: skip
    assert (job["device"], job["data_root"]) == ("cuda", "/d")


def test_a_row_counts_only_for_the_settings_it_ran():
    """Each row records the method settings it ran; a finished run is skipped only while
    its entry still has those settings (a new default runs it again, and the report
    reads the run's last row); rows written before rows recorded settings count."""
    cells = {c["id"]: c for c in regimes.load_cells()}
    entries = {"cobo": ("cobo", {}), "g2": ("cobo", {"gamma": 2.0})}
    now = regimes.entry_settings("cobo", {})
    assert now["pull"] == "mean" and now["gamma"] == 3.0  # the defaults written out
    assert regimes.entry_settings("cobo", {"gamma": 2.0})["gamma"] == 2.0
    key = ("quad-2x2", "cobo", 0, "test")
    other = ("quad-2x2", "g2", 0, "test")

    def planned(done):
        jobs = regimes.plan_jobs([cells["quad-2x2"]], entries, [0], "test", done)
        return sorted(j["entry"] for j in jobs)

    assert planned({}) == ["cobo", "g2"]
    assert planned({key: now, other: now}) == ["g2"]
    assert planned({key: now, other: regimes.entry_settings("cobo", {"gamma": 2.0})}) == []
    # a row that recorded no settings predates the keys of OFF_AT: it counts only where
    # they are off (or, as below, inert on the cell)
    assert now["alignment_batches"] == 2
    assert planned({key: None, other: None}) == ["cobo", "g2"]
    previous = {"cobo": ("cobo", {"preset": "paper"})}  # none of them: they count
    assert regimes.plan_jobs([cells["quad-2x2"]], previous, [0], "test", {key: None}) == []
    assert planned({key: {**now, "pull_at": "current"}, other: now}) == ["cobo", "g2"]
    # a key added since, null while off, leaves a row that did not record it valid; set,
    # it does not
    done = {other: regimes.entry_settings("cobo", {"gamma": 2.0})}
    assert planned({key: {**now, "a_key_added_later": None}, **done}) == []
    assert planned({key: {**now, "a_key_added_later": 0.08}, **done}) == ["cobo"]
    # a row written before algorithm.rule was renamed preset counts as the same preset
    old = {k: v for k, v in now.items() if k != "preset"}
    assert planned({key: {**old, "rule": now["preset"]}, **done}) == []
    assert planned({key: {**old, "rule": "paper"}, **done}) == ["cobo"]
    first = {"cell": "quad-2x2", "entry": "cobo", "seed": 0, "loss": 1.0, "diverged": False}
    rows = [
        {**first, "entry": "local", "loss": 2.0},
        {**first, "entry": "oracle", "loss": 0.0},
        first,
        {**first, "loss": 0.5},  # run again with new settings
    ]
    table = report.summarize(rows)
    assert table["quad-2x2"]["cobo"]["score"] == 0.5 and table["quad-2x2"]["cobo"]["n"] == 1


def test_rows_from_before_the_sample_count_keys_count_where_they_change_nothing():
    """The defaults' sampling_samples (12) raises the sampler's rates and the re-checks'
    only where the sampler alone samples a pair fewer times in the cell's run: a row
    written before the key (the re-checks' target then recheck_samples: 8, or 0 before
    that key) counts there as the defaults' run only where neither target changes
    anything (quad-2x2: 4 clients, 200 rounds), and runs again where one acts
    (fmnist-800-r1000: about 2 samples a pair; fmnist-400: about 8); 0 is a key off,
    the same as absent."""
    cells = {c["id"]: c for c in regimes.load_cells()}
    now = regimes.entry_settings("cobo", {})
    assert now["sampling_samples"] == 12.0 and "recheck_samples" not in now
    before = {k: v for k, v in now.items() if k != "sampling_samples"}
    # as such a row recorded them: the keys raycobo 0.8.0 folded, the fade's schedule
    before = {**before, **FOLDED_08, "fade_decay": "none", "recheck_samples": 8.0}
    small, large, mid = cells["quad-2x2"], cells["fmnist-800-r1000"], cells["fmnist-400"]
    assert regimes.same_settings(before, now, small)
    assert not regimes.same_settings(before, now, large)
    assert not regimes.same_settings(before, now, mid)
    assert not regimes.same_settings(before, now)  # no cell: not provably the same
    off = regimes.entry_settings("cobo", {"sampling_samples": 0.0})
    assert not regimes.same_settings(before, off, large)  # the row's re-checks: x 8 / 1.9
    assert regimes.same_settings(before, off, mid)  # 8 is inert at S = 8.2
    older = {**before, "recheck_samples": 0.0}
    assert regimes.same_settings(older, off, large) and regimes.same_settings(older, off)
    changed = {**before, "gamma": 1.5}
    assert not regimes.same_settings(changed, now, small)  # another key differs too


def test_rows_of_raycobo_0_4_count_where_its_removed_keys_change_nothing():
    """raycobo 0.4 recorded recheck_samples (the re-checks' own target, 8), fade_decay
    (none) and sampling_scale_max (4); 0.5 scales the re-checks by sampling_samples (12)
    and fixes the other two. A 0.4 row of the defaults counts as 0.5's where the sampler
    samples each pair at least 12 times (quad-2x2, fmnist-80-r1000), not where 8 or 12
    acts (fmnist-400: S = 8.2, fmnist-80-r200: S = 3.2); a row at another fade schedule
    or bound, or from before fade_decay (the fade decayed as gamma is), never."""
    cells = {c["id"]: c for c in regimes.load_cells()}
    now = regimes.entry_settings("cobo", {})
    old = {**now, "recheck_samples": 8.0, "fade_decay": "none", "sampling_scale_max": 4.0}
    for cell, same in [
        ("quad-2x2", True),
        ("fmnist-80-r1000", True),
        ("fmnist-400", False),
        ("fmnist-80-r200", False),
    ]:
        assert regimes.same_settings(old, now, cells[cell]) == same, cell
    small = cells["quad-2x2"]
    assert regimes.same_settings({**old, "recheck_samples": 12.0}, now)  # the same target
    assert not regimes.same_settings({**old, "fade_decay": "gamma"}, now, small)
    assert not regimes.same_settings({**old, "sampling_scale_max": 2.0}, now, small)
    pre_schedule = {k: v for k, v in old.items() if k != "fade_decay"}
    assert not regimes.same_settings(pre_schedule, now, small)
    plain = regimes.entry_settings("cobo", {"pull_threshold": 0.0})  # no re-checks: no target
    fixed = {"fade_decay": "none", "sampling_scale_max": 4.0}
    assert regimes.same_settings({**plain, **fixed, "recheck_samples": None}, plain)


def test_rows_without_fade_clients_count_where_the_cell_has_no_more_clients():
    """The fade grows past 160 present clients (fade_clients 160, a key from the
    twentieth round until raycobo 0.7.0): a row that ran the same settings before it
    counts on cells of at most 160 clients (fmnist-160, quad-2x2), not on larger ones
    (fmnist-400), nor without a cell to tell."""
    cells = {c["id"]: c for c in regimes.load_cells()}
    now = regimes.entry_settings("cobo", {})  # the defaults: fade 1, closure 0.1
    assert not {"fade", "closure", "fade_clients"} & set(now)
    ran = {**now, **FOLDED_08, "pull_at": "stepped", "initial_weight": 0.0}  # as recorded
    assert regimes.same_settings(ran, now, cells["fmnist-160"])
    assert regimes.same_settings(ran, now, cells["quad-2x2"])
    assert not regimes.same_settings(ran, now, cells["fmnist-400"])
    assert not regimes.same_settings(ran, now)


def test_rows_before_0_7_count_where_the_folded_keys_had_the_values_they_take_now():
    """raycobo 0.7.0 folded pull_at into pull, initial_weight into pull_threshold and
    fade_clients into the fade; a row that recorded them counts as today's run where
    they held the values those keys now give them, and not otherwise."""
    big = {c["id"]: c for c in regimes.load_cells()}["fmnist-400"]
    now = regimes.entry_settings("cobo", {})
    then = {**now, **FOLDED_08, "pull_at": "stepped", "initial_weight": 0.0, "fade_clients": 160}
    assert regimes.same_settings(then, now, big)
    for key, other in [("pull_at", "current"), ("initial_weight", 1.0), ("fade_clients", 80)]:
        assert not regimes.same_settings({**then, key: other}, now, big), key
    paper = regimes.entry_settings("cobo", {"preset": "paper"})
    old = {**paper, **PAPER_08, "pull_at": "current", "initial_weight": 1.0, "fade_clients": None}
    assert regimes.same_settings(old, paper, big)
    assert not regimes.same_settings({**old, "initial_weight": 0.0}, paper, big)


# the keys raycobo 0.8.0 folded, as a row of 0.7 recorded them for the defaults and paper
FOLDED_08 = {"fade": 1.0, "recheck": 0.02, "closure": 0.1}
PAPER_08 = {"fade": None, "recheck": 0.0, "closure": None}


def test_rows_before_0_8_count_where_the_folded_keys_had_the_values_they_take_now():
    """raycobo 0.8.0 folded the fade, re-checks and closure into the pull's threshold;
    a row of 0.7 counts as
    today's run where they held the values those keys now give them, and not
    otherwise (also under full sampling, where there was no closure, and in the
    simplex domain, where none of the three applied)."""
    big = {c["id"]: c for c in regimes.load_cells()}["fmnist-400"]
    now = regimes.entry_settings("cobo", {})
    assert not set(FOLDED_08) & set(now)
    assert regimes.same_settings({**now, **FOLDED_08}, now, big)
    for key, other in [("fade", 0.0), ("recheck", 0.0), ("closure", 0.3)]:
        assert not regimes.same_settings({**now, **FOLDED_08, key: other}, now, big), key
    paper = regimes.entry_settings("cobo", {"preset": "paper"})
    assert regimes.same_settings({**paper, **PAPER_08}, paper, big)
    assert not regimes.same_settings({**paper, **PAPER_08, "recheck": 0.02}, paper, big)
    full = regimes.entry_settings("cobo", {"sampling": "full"})
    assert regimes.same_settings({**full, **FOLDED_08, "closure": None}, full, big)
    simplex = regimes.entry_settings("cobo", {"domain": "simplex"})
    nothing = {"fade": None, "recheck": None, "closure": None}
    assert regimes.same_settings({**simplex, **nothing}, simplex, big)


def test_the_report_leaves_out_rows_the_defaults_no_longer_run():
    """A `cobo` (or candidate) row whose recorded settings are not the entry's today,
    on a cell where the difference acts, is left out of the table and named under it;
    where the new keys are inert (quad-2x2) and for Local and Oracle the rows stay."""
    before = regimes.entry_settings("cobo", {"sampling_samples": 0.0})
    row = {"diverged": False, "loss": None, "accuracy": 0.7, "settings": before}
    rows = [
        {**row, "cell": "fmnist-800-r1000", "entry": "cobo", "seed": 0},
        {
            **row,
            "cell": "fmnist-800-r1000",
            "entry": "loo-sampling-samples",
            "seed": 0,
            "settings": regimes.entry_settings(
                "cobo", regimes.load_candidates()["loo-sampling-samples"]
            ),
        },
        {**row, "cell": "quad-2x2", "entry": "cobo", "seed": 0},
        {**row, "cell": "fmnist-800-r1000", "entry": "local", "seed": 0, "settings": None},
    ]
    kept, notes = report.current(rows)
    assert [(r["cell"], r["entry"]) for r in kept] == [
        ("fmnist-800-r1000", "loo-sampling-samples"),
        ("quad-2x2", "cobo"),
        ("fmnist-800-r1000", "local"),
    ]
    assert notes == ["fmnist-800-r1000 cobo (seeds 0)"]
    now = {**row, "settings": regimes.entry_settings("cobo", {})}
    assert (
        report.current([{**now, "cell": "fmnist-800-r1000", "entry": "cobo", "seed": 0}])[1] == []
    )


def test_a_run_already_there_under_another_name_is_copied_not_run_again():
    """A candidate's run whose settings a new default makes the defaults' is the
    defaults' run (the cell, seed and settings fix every draw): measured here, the two
    runs give the same row; the planner records it under the new entry, naming the entry
    it ran as, and runs only what no row with those settings covers (another seed or
    device, or a row that recorded no settings)."""
    cells = {c["id"]: c for c in regimes.load_cells()}
    cell = cells["quad-2x2"]
    now = regimes.entry_settings("cobo", {})
    explicit = {"alignment_batches": now["alignment_batches"], "gamma": now["gamma"]}
    jobs = regimes.plan_jobs(
        [cell], {"cobo": ("cobo", {}), "named": ("cobo", explicit)}, [0], "test", {}
    )
    ran = {j["entry"]: regimes.run_one(j) for j in jobs}
    measured = ("loss", "w_within", "w_across", "mass_inside", "settings")
    assert [ran["cobo"][k] for k in measured] == [ran["named"][k] for k in measured]

    rows = [ran["named"]]
    plan = regimes.plan_jobs([cell], {"cobo": ("cobo", {})}, [0, 1], "test", {})
    plan += regimes.plan_jobs([cell], {"cobo": ("cobo", {})}, [0], "test", {}, device="cuda")
    todo, copies = regimes.copied_runs(plan, rows)
    assert [(j["seed"], j.get("device")) for j in todo] == [(1, None), (0, "cuda")]
    assert len(copies) == 1
    copy = copies[0]
    assert (copy["entry"], copy["copied_from"], copy["overrides"]) == ("cobo", "named", {})
    assert copy["loss"] == ran["named"]["loss"] and copy["seed"] == 0
    # a copy of a copy names the run's own entry; no settings recorded, or other settings
    # (the previous defaults): run
    again, [second] = regimes.copied_runs(plan[:1], [{**copy, "entry": "other"}])
    assert again == [] and second["copied_from"] == "named"
    assert regimes.copied_runs(plan[:1], [{**ran["named"], "settings": None}])[1] == []
    old = regimes.entry_settings("cobo", {"alignment_batches": 1})
    assert regimes.copied_runs(plan[:1], [{**ran["named"], "settings": old}])[1] == []


def digits_rows() -> tuple[dict, list[dict]]:
    """Result rows of one cell: Local and Oracle on seeds 0-1, CoBo on seed 0."""
    row = {"cell": "digits-8-r100", "diverged": False, "loss": None}
    rows = [
        {**row, "entry": "local", "seed": 0, "accuracy": 0.80},
        {**row, "entry": "local", "seed": 1, "accuracy": 0.60},
        {**row, "entry": "oracle", "seed": 0, "accuracy": 0.90},
        {**row, "entry": "oracle", "seed": 1, "accuracy": 0.90},
        {**row, "entry": "cobo", "seed": 0, "accuracy": 0.85},
    ]
    return row, rows


def test_an_entry_on_fewer_seeds_is_measured_against_the_same_seeds():
    """The gap closed compares an entry with Local and Oracle over the seeds it ran."""
    row, rows = digits_rows()
    cobo = report.summarize(rows)["digits-8-r100"]["cobo"]
    assert cobo["gap"] == pytest.approx(0.5)  # (0.85 - 0.80) / (0.90 - 0.80), seed 0 only
    # and an entry whose baselines ran on fewer seeds: its gap over theirs only
    no_oracle_1 = [r for r in rows if not (r["entry"] == "oracle" and r["seed"] == 1)]
    rows = [*no_oracle_1, {**row, "entry": "cobo", "seed": 1, "accuracy": 0.99}]
    cobo = report.summarize(rows)["digits-8-r100"]["cobo"]
    assert cobo["gap"] == pytest.approx(0.5) and cobo["score"] == pytest.approx(0.92)


def test_the_quadratic_validates_on_other_problems():
    """The quadratic has no samples to hold out: its validation split draws other
    problem instances (seeds offset), so no test instance chooses a default."""
    cells = {c["id"]: c for c in regimes.load_cells()}
    val = regimes.cell_config(cells["quad-2x2"], "validation", 2)
    test = regimes.cell_config(cells["quad-2x2"], "test", 2)
    assert test["seed"] == 2 and val["seed"] == regimes.VALIDATION_SEED_OFFSET + 2
    digits = regimes.cell_config(cells["digits-8-r100"], "validation", 2)
    assert digits["seed"] == 2 and digits["data"]["evaluate_on"] == "validation"


def test_the_tuned_entry_is_the_best_sweep_point_on_validation():
    """Each cell's ``tuned`` point: the best mean validation score over the seeds every
    grid point ran (a diverged run worst, the loss minimised); none while a point is
    missing; --sweep only on validation and --tuned only on test."""
    cells = {c["id"]: c for c in regimes.load_cells()}
    grid = {"gamma": [1.0, 3.0], "pull_strength": [0.5]}
    points = regimes.sweep_entries(grid)
    assert list(points) == [
        "sweep:gamma=1.0,pull_strength=0.5",
        "sweep:gamma=3.0,pull_strength=0.5",
    ]
    low, high = points

    def row(cell, entry, seed, value, diverged=False):
        metric = cells[cell].get("metric", "accuracy")
        return {"cell": cell, "entry": entry, "seed": seed, "diverged": diverged,
                "accuracy": value if metric == "accuracy" else None, "loss": value}  # fmt: skip

    rows = [
        row("digits-8-r100", low, 0, 0.80), row("digits-8-r100", low, 1, 0.90),
        row("digits-8-r100", high, 0, 0.84), row("digits-8-r100", high, 1, 0.50),
        row("digits-8-r100", high, 2, 0.99),  # seed 2: not run by every point
    ]  # fmt: skip
    choice = regimes.tuned_choice(rows, cells["digits-8-r100"], grid)
    assert choice == {"gamma": 1.0, "pull_strength": 0.5}  # 0.85 against 0.67
    rows[0]["diverged"] = True
    assert regimes.tuned_choice(rows, cells["digits-8-r100"], grid)["gamma"] == 3.0
    quad = [row("quad-2x2", low, 0, 0.2), row("quad-2x2", high, 0, 0.1)]
    assert regimes.tuned_choice(quad, cells["quad-2x2"], grid)["gamma"] == 3.0  # the lower loss
    assert regimes.tuned_choice(quad[:1], cells["quad-2x2"], grid) is None

    class Args:
        no_baselines, no_cobo, candidates, methods, sweep, split = True, False, "", "", True, "test"

    with pytest.raises(ValueError, match="validation"):
        regimes.choose_entries(Args(), {})
    Args.split = "validation"
    entries = regimes.choose_entries(Args(), {})
    assert "cobo" in entries and any(e.startswith(regimes.SWEEP) for e in entries)
    assert "local" not in entries
    Args.methods, Args.no_cobo, Args.sweep = "fedamp,pfedgraph", True, False
    assert regimes.choose_entries(Args(), {}) == {
        "fedamp": ("fedamp", {}),
        "pfedgraph": ("pfedgraph", {}),
    }
    Args.methods = "fedamp,cobo"
    with pytest.raises(ValueError, match="--methods: no other method cobo"):
        regimes.choose_entries(Args(), {})
    Args.methods, Args.candidates = "", "x0-full"  # raycobo 0.4's defaults: rows only
    with pytest.raises(ValueError, match="x0-full is history.*cannot run it again"):
        regimes.choose_entries(Args(), regimes.load_candidates())
    assert not set(regimes.load_history()) & set(regimes.load_candidates())
    Args.candidates = ""
    Args.methods, Args.no_cobo = "", False
    Args.sweep, Args.tuned = False, True
    with pytest.raises(ValueError, match="test split"):
        regimes.tuned_jobs([cells["quad-2x2"]], Args(), [0], {})
    tuned = [{**r, "entry": "tuned", "overrides": {"gamma": 3.0}} for r in quad]
    assert report.tuned_points(tuned) == (
        "`tuned`, the sweep point best on each cell's validation split: quad-2x2 gamma 3.0."
    )


def test_the_gap_closed_carries_its_standard_error_over_seeds():
    """Beside the gap closed (of the seed means), the spread of the per-seed gaps over
    sqrt(seeds): a cell whose Oracle - Local is a few points is noisy, and the report
    says how much; none with one seed."""
    row, rows = digits_rows()
    assert report.summarize(rows)["digits-8-r100"]["cobo"]["gap_se"] is None
    rows.append({**row, "entry": "cobo", "seed": 1, "accuracy": 0.90})  # gaps 0.5 and 1.0
    table = report.summarize(rows)
    cobo = table["digits-8-r100"]["cobo"]
    assert cobo["gap"] == pytest.approx(0.875)  # (0.875 - 0.70) / (0.90 - 0.70)
    assert cobo["gap_se"] == pytest.approx(0.5 / 2**0.5 / 2**0.5)  # sd 0.354 / sqrt 2
    assert "**87 %** ± 25" in report.markdown(table, ["cobo"])  # 0.87499...


def test_the_diagnosis_replaces_w_after_every_step():
    """diagnose.py: W replaced by the true blocks, the learned W without its cross-cluster
    pairs, or with every pair of a cluster at 1 -- and the runs really carry it."""
    import torch

    diagnose = _load("diagnose")
    blocks = diagnose.true_blocks([0, 0, 1])
    W = torch.tensor([[1.0, 0.4, 0.7], [0.4, 1.0, 0.2], [0.7, 0.2, 1.0]])
    assert torch.equal(diagnose.replaced(W, "true", blocks), blocks)
    assert torch.equal(diagnose.replaced(W, "no-cross", blocks), W * blocks)
    full = diagnose.replaced(W, "full-recall", blocks)
    assert full[0, 1] == 1.0 and full[0, 2] == 0.7 and full[1, 2] == 0.2
    assert torch.equal(diagnose.replaced(W, "learned", blocks), W)
    assert torch.equal(diagnose.replaced(W, "found", blocks), blocks)
    # the groups a W's pulled pairs join: 0-2 at 0.7 (1 alone) with a cut of 0.5; 0-1-2
    # through 0-2 and 1-2 without one; w_ij counts where only one of w_ij, w_ji is pulled
    assert diagnose.found_groups(W, 0.5) == [0, 1, 0]
    assert diagnose.found_groups(W, 0.0) == [0, 0, 0]
    chain = torch.eye(5)
    chain[3, 1] = chain[1, 4] = 0.9  # 1-3, 1-4: one group through 1; 0 and 2 alone
    assert diagnose.found_groups(chain, 0.5) == [0, 1, 2, 1, 1]

    # the patch itself: CoBo's W step, then W replaced (on a 3-client W)
    from raycobo.algorithms import build_algorithm
    from raycobo.algorithms.cobo import CoBoState
    from raycobo.config import validate

    algo = build_algorithm(validate({"algorithm": {"name": "cobo"}}).algorithm, 100, 0)
    state = CoBoState(X=torch.zeros(3, 2), W=torch.eye(3))
    edges, scores = torch.tensor([[0, 1], [0, 2]]), torch.tensor([1.0, 1.0])
    stepped = algo.apply_scores(state, edges, scores, 0).W  # both pairs pulled
    with diagnose.w_replaced("no-cross", [0, 0, 1]) as counts:
        W = algo.apply_scores(state, edges, scores, 0).W
    assert counts == [1] and torch.equal(W, stepped * blocks)
    with pytest.raises(ValueError, match="no W step"), diagnose.w_replaced("true", [0, 0, 1]):
        pass
    no_groups = pytest.raises(ValueError, match="groups a learned run")
    with no_groups, diagnose.w_replaced("found", [0, 0, 1]):
        pass

    # a run carries it: the true blocks from the first step beat the learned W, which
    # pulled a cross-cluster pair early (quad-2x2, 10 rounds: loss 0.365 vs 0.393)
    cell = {c["id"]: c for c in regimes.load_cells()}["quad-2x2"]
    learned = diagnose.run_mode(cell, "test", 0, "learned", threads=1, rounds=10)
    true = diagnose.run_mode(cell, "test", 0, "true", threads=1, rounds=10)
    assert learned["cross_pulled_max"] >= 1
    assert true["loss"] < learned["loss"]
    # found: the blocks of the groups the learned W ended with (here the true clusters'),
    # so it runs as true does, bit for bit
    assert learned["groups"] == [0, 0, 1, 1]
    found = diagnose.run_mode(cell, "test", 0, "found", 1, rounds=10, groups=learned["groups"])
    assert found["loss"] == true["loss"]


def test_the_score_separation_is_measured_on_one_minibatch_and_on_a_mean():
    """scores.py: the clusters' separation of Eq. (1)'s score at chosen rounds, with one
    minibatch per end and with the mean of several; on quad-2x2 (gradient noise 0.1) the
    mean of 8 draws separates the two clusters better than one draw."""
    import torch

    scores = _load("scores")
    inside = torch.tensor([True, True, False, False])
    got = scores.separation(torch.tensor([0.5, 0.3, -0.1, 0.1]), inside)
    assert got["inside"] == 0.4 and got["across"] == 0.0
    assert got["d"] == pytest.approx(2.83, abs=0.01)
    cell = {c["id"]: c for c in regimes.load_cells()}["quad-2x2"]
    cfg = regimes.cell_config(cell, "validation", 0)
    cfg["algorithm"] = {"name": "cobo"}
    rows = scores.measure(cfg, [0, 3], batches=8, pairs=100, signals=True)
    assert [r["round"] for r in rows] == [0, 3]
    first = rows[0]
    assert first["mean_of_8"]["d"] > first["one_batch"]["d"]
    assert first["mean_of_8"]["inside_sd"] < first["one_batch"]["inside_sd"]
    # centred on the mean over the ends, the scores across the two clusters fall below 0
    # (two clusters: a correlation of -1 less the noise), and none reaches the threshold
    centred = first["centred_mean_of_8"]
    assert centred["across"] < min(0.0, first["mean_of_8"]["across"])
    assert centred["across_reach"] == 0.0 and 0.0 <= centred["inside_reach"] <= 1.0
    # the reach is read at each round's step: gamma / sqrt(1 + k_t) raises the score needed
    from raycobo.algorithms import build_algorithm
    from raycobo.config import validate

    algo = build_algorithm(validate({"algorithm": {"name": "cobo"}}).algorithm, 200, 0)
    assert scores.first_step(algo, 0, 4) == pytest.approx(0.5 / 3.0)
    assert scores.first_step(algo, 100, 4) > scores.first_step(algo, 0, 4)
    with_reach = scores.separation(torch.tensor([0.5, 0.1, -0.1, 0.2]), inside, 0.15)
    assert with_reach["inside_reach"] == 0.5 and with_reach["across_reach"] == 0.5
    # the other signals: nothing to read at round 0 (no update, every end at its own
    # point's loss); by round 3 the midpoint costs a cluster's pairs less than the others
    assert first["updates_cosine"]["inside"] == 0.0 and first["midpoint_gain"]["d"] is None
    later = rows[1]
    assert later["midpoint_gain"]["inside"] > later["midpoint_gain"]["across"]
    assert later["updates_cosine"]["inside"] > later["updates_cosine"]["across"]


def test_choose_takes_the_entry_passing_more_cells_then_the_higher_gap():
    """An entry passes a cell at >= 75 % of the gap with >= 0.9 of W's mass inside; a
    missing or diverged run is no pass; more passes win over a higher mean gap, and
    between equal passes the higher mean gap wins."""
    choose = report.sibling("choose")

    def run(cell, entry, acc, mass=0.95, diverged=False):
        return {"cell": cell, "entry": entry, "seed": 0, "accuracy": acc, "loss": 1.0,
                "diverged": diverged, "seconds": 1.0, "mass_inside": mass,
                "w_within": 0.7, "w_across": 0.01}  # fmt: skip

    cells = ["fmnist-160", "fmnist-400"]
    rows = [run(c, e, a) for c in cells for e, a in (("local", 0.50), ("oracle", 0.60))]
    rows += [
        run("fmnist-160", "high", 0.599, mass=0.85),  # 99 %, mass short
        run("fmnist-400", "high", 0.599, mass=0.85),
        run("fmnist-160", "kept", 0.58),  # 80 %, passes
        run("fmnist-400", "kept", 0.58),
        run("fmnist-160", "one", 0.59),  # passes one cell, 70 % on the other
        run("fmnist-400", "one", 0.57),
        run("fmnist-160", "gone", 0.59),  # passes one cell, diverged on the other
        run("fmnist-400", "gone", 0.59, diverged=True),
        run("fmnist-160", "missing", 0.59),  # passes one cell, no row on the other
    ]
    table = report.summarize(rows)
    best, lines = choose.choose(table, ["high", "gone", "one", "kept", "missing"], cells)
    assert best == "kept"
    assert ["fmnist-400", "missing", "no", "row"] in [line.split() for line in lines]
    assert "gone: passes 1 of 2 cells, mean gap 45.0 %" in lines
    assert "missing: passes 1 of 2 cells, mean gap 45.0 %" in lines
    best, _ = choose.choose(table, ["gone", "missing", "one"], cells)  # 1 pass each
    assert best == "one"


def test_a_signed_matrix_mass_counts_only_as_a_share_of_sizes():
    """FedFomo's and APPLE's rows from before mass_inside was of |w| held no share (e.g.
    8.11): the report shows their mass only from rows measured as a share."""
    base = {
        "cell": "digits-8-r100", "entry": "fedfomo", "method": "fedfomo", "seed": 0,
        "split": "test", "accuracy": 0.9, "loss": 0.3, "diverged": False, "seconds": 1.0,
    }  # fmt: skip
    old = {**base, "mass_inside": 8.11}
    assert report.summarize([old])["digits-8-r100"]["fedfomo"]["mass_inside"] is None
    new = {**base, "mass_inside": 0.7, "mass_of": "abs"}
    assert report.summarize([old, {**new, "seed": 1}])["digits-8-r100"]["fedfomo"][
        "mass_inside"
    ] == pytest.approx(0.7)
    cobo = {**base, "entry": "cobo", "method": "cobo", "mass_inside": 0.9}  # W >= 0: counts
    assert report.summarize([cobo])["digits-8-r100"]["cobo"]["mass_inside"] == 0.9


def test_a_cell_without_clusters_tunes_its_baselines_and_reports_the_margin():
    """A cell with ``baselines`` (no ground-truth clusters) has no Oracle: on validation
    every point of each baseline's grid runs, on test each baseline runs under its name
    with the point best on validation; the report gives each other entry's margin over
    the best baseline over the seeds both ran, and the verdict names the cells where it
    is behind by more than noise (twice the standard error)."""
    cells = {c["id"]: c for c in regimes.load_cells()}
    cell = cells["fmnist-20-dir0.3-r300"]
    assert regimes.clients(cell) == 20
    given = {"local": ("local", {}), "oracle": ("oracle", {}), "cobo": ("cobo", {})}

    class Args:
        no_baselines, split = False, "validation"

    val = regimes.cell_entries(cell, given, Args(), [])
    assert "oracle" not in val and "local" in val and "cobo" in val
    assert val["ditto:lam=0.1"] == ("ditto", {"lam": 0.1})
    assert val["fedavg_ft:ft_steps=30"] == ("fedavg_ft", {"ft_steps": 30})
    assert regimes.cell_entries(cells["quad-2x2"], given, Args(), []) is given

    def row(entry, seed, acc, split="validation"):
        method = regimes.baseline_of(entry, cell) or "cobo"
        return {"cell": cell["id"], "entry": entry, "method": method, "seed": seed,
                "split": split, "accuracy": acc, "loss": 1.0, "diverged": False}  # fmt: skip

    scores = {"local": 0.60, "fedavg": 0.70, "fedavg_ft:ft_steps=30": 0.74,
              "fedavg_ft:ft_steps=100": 0.78, "ditto:lam=0.01": 0.65,
              "ditto:lam=0.1": 0.80, "ditto:lam=1.0": 0.79}  # fmt: skip
    rows = [row(e, s, a + 0.01 * s) for e, a in scores.items() for s in (0, 1)]
    Args.split = "test"
    test = regimes.cell_entries(cell, given, Args(), rows)
    assert test["ditto"] == ("ditto", {"lam": 0.1})
    assert test["fedavg_ft"] == ("fedavg_ft", {"ft_steps": 100})
    assert test["local"] == ("local", {}) and "oracle" not in test
    jobs = regimes.plan_jobs([cell], lambda c: regimes.cell_entries(c, given, Args(), rows),
                             [0], "test", {})  # fmt: skip
    assert {j["entry"] for j in jobs} == {"local", "fedavg", "fedavg_ft", "ditto", "cobo"}

    rows += [row("cobo", 0, 0.75), row("cobo", 1, 0.79)]  # 5 and 2 points behind ditto
    table = report.summarize(rows)
    cobo = table[cell["id"]]["cobo"]
    assert cobo["best"] == "ditto:lam=0.1" and cobo["margin"] == pytest.approx(-0.035)
    assert cobo["margin_se"] == pytest.approx(0.015)  # sd of -0.05, -0.02 over sqrt 2
    assert report.behind(cobo) and not table[cell["id"]]["ditto:lam=0.1"].get("margin")
    v = report.verdict(table, "cobo")
    assert v["unclustered"] == [cell["id"]] and v["behind_best"] == [cell["id"]]
    assert v["cells"] == 0  # no Local -> Oracle gap there
    text = report.markdown_unclustered(table, ["cobo"])
    assert "| fmnist-20-dir0.3-r300 | ditto:lam=0.1: 80.5 | 77.0, **-3.5** ± 1.5 |" in text
    assert "fmnist-20-dir0.3-r300" not in report.markdown(table, ["cobo"])
    rows[-1] = row("cobo", 1, 0.83)  # -5 and +2: within noise
    assert not report.behind(report.summarize(rows)[cell["id"]]["cobo"])
