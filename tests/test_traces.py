import pytest

from mlsched.workloads import generators, traces
from mlsched.workloads.traces import TraceError

HEADER = "name,arrival_s,model,epochs,arch,workers,ps\n"


def test_parses_rows_in_any_order_with_optional_columns_empty():
    text = HEADER + "b,50,ctc,10,,,\na,5,resnet-50,20.5,allreduce,4,\nc,7,wlm,3,ps,2,1\n"
    jobs = traces.parse(text, "t.csv")
    assert [j.name for j in jobs] == ["a", "c", "b"]
    assert jobs[0].arch == "allreduce" and jobs[0].workers == 4 and jobs[0].ps is None
    assert jobs[2].model == "cnn-text-classification" and jobs[2].arch == "ps"
    assert jobs[1].ps == 1


def test_optional_columns_may_be_absent():
    jobs = traces.parse("name,arrival_s,model,epochs\nx,0,dssm,5\n")
    assert jobs[0].arch == "ps" and jobs[0].workers is None


@pytest.mark.parametrize("body,message", [
    ("a,0,bert,10,,,\n", r"t.csv:2: unknown model 'bert'"),
    ("a,0,wlm,0,,,\n", r"t.csv:2: epochs must be > 0"),
    ("a,0,wlm,-3,,,\n", r"t.csv:2: epochs must be > 0"),
    ("a,0,wlm,1,,,\na,1,wlm,1,,,\n", r"t.csv:3: duplicate job name 'a' \(first on line 2\)"),
    ("a,soon,wlm,1,,,\n", r"t.csv:2: arrival_s must be a number, got 'soon'"),
    ("a,-1,wlm,1,,,\n", r"t.csv:2: arrival_s must be >= 0"),
    ("a,0,wlm,nan,,,\n", r"t.csv:2: epochs must be finite"),
    ("a,0,wlm,1,gpu,,\n", r"t.csv:2: arch must be 'ps' or 'allreduce'"),
    ("a,0,wlm,1,ps,2.5,\n", r"t.csv:2: workers must be a whole number"),
    ("a,0,wlm,1,ps,0,\n", r"t.csv:2: workers must be >= 1"),
    ("a,0,wlm,1,allreduce,2,1\n", r"t.csv:2: an allreduce job has no parameter servers"),
    ("a,0,wlm\n", r"t.csv:2: expected 7 fields, got 3"),
])
def test_malformed_rows_name_file_line_and_reason(body, message):
    with pytest.raises(TraceError, match=message):
        traces.parse(HEADER + body, "t.csv")


def test_missing_columns_and_empty_files_are_reported():
    with pytest.raises(TraceError, match=r"t.csv:1: missing column\(s\) epochs"):
        traces.parse("name,arrival_s,model\na,0,wlm\n", "t.csv")
    with pytest.raises(TraceError, match="t.csv: empty file"):
        traces.parse("", "t.csv")
    with pytest.raises(TraceError, match="t.csv: no jobs"):
        traces.parse(HEADER, "t.csv")
    with pytest.raises(TraceError, match=r"unknown column\(s\) gpus"):
        traces.parse("name,arrival_s,model,epochs,gpus\n", "t.csv")


def test_unreadable_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace"):
        traces.read(tmp_path / "missing.csv")


def test_write_then_read_round_trips(tmp_path):
    jobs = generators.generate(jobs=20, seed=3, arch_mix=0.5)
    path = tmp_path / "t.csv"
    traces.write(jobs, path)
    back = traces.read(path)
    assert [(j.name, j.model, j.arch) for j in back] == [(j.name, j.model, j.arch) for j in jobs]
    assert [j.epochs for j in back] == pytest.approx([j.epochs for j in jobs], rel=1e-6)


def test_generators_are_seeded_and_deterministic():
    a = generators.generate(jobs=50, seed=7)
    b = generators.generate(jobs=50, seed=7)
    c = generators.generate(jobs=50, seed=8)
    assert a == b and a != c
    assert len(a) == 50 and all(j.epochs > 0 for j in a)
    assert [j.arrival_s for j in a] == sorted(j.arrival_s for j in a)


def test_uniform_pattern_brings_rate_jobs_per_slot():
    jobs = generators.generate(jobs=30, rate=3, pattern="uniform", seed=1, interval_s=1200)
    per_slot = {}
    for j in jobs:
        per_slot[int(j.arrival_s // 1200)] = per_slot.get(int(j.arrival_s // 1200), 0) + 1
    assert set(per_slot.values()) == {3}


def test_google_pattern_has_its_burst_and_poisson_its_mean():
    g = generators.generate(jobs=400, rate=4, pattern="google", seed=0)
    counts = {}
    for j in g:
        counts[int(j.arrival_s // 1200)] = counts.get(int(j.arrival_s // 1200), 0) + 1
    assert max(counts.values()) >= 10  # the burst slot
    p = generators.generate(jobs=3000, rate=3, pattern="poisson", seed=0)
    slots = p[-1].arrival_s / 1200
    assert 2.7 < len(p) / slots < 3.3


def test_job_lengths_are_long_tailed():
    jobs = generators.generate(jobs=2000, seed=0)
    from mlsched.workloads import catalog, speed_table
    minutes = sorted(j.epochs * catalog.MODELS[j.model].steps_per_epoch
                     / speed_table.table_speed(j.model, 1, 1) / 60 for j in jobs)
    median, p95 = minutes[len(minutes) // 2], minutes[int(len(minutes) * 0.95)]
    assert 70 < median < 90
    assert p95 > 4 * median  # a long tail
    mean = sum(minutes) / len(minutes)
    assert mean > median


def test_generator_rejects_bad_arguments():
    with pytest.raises(ValueError, match="unknown arrival pattern"):
        generators.generate(pattern="weekly")
    with pytest.raises(ValueError, match="jobs must be > 0"):
        generators.generate(jobs=0)
