"""Progress in a captured log: a line at most once a minute while work is under way."""

from __future__ import annotations

import pytest

from agentgym_rl import progress


@pytest.fixture
def clock(monkeypatch):
    """The progress module's clock, set by hand: `clock[0] = seconds`."""
    now = [1000.0]
    monkeypatch.setattr(progress, "_clock", lambda: now[0])
    monkeypatch.setattr(progress, "bars_shown", lambda: False)
    return now


def test_a_captured_log_gets_a_line_at_most_once_a_minute_and_none_at_the_ends(clock, capsys):
    with progress.progress_bar(total=90, desc="validation (step 0)", unit="ep") as bar:
        for at, done in [(10, 1), (59, 2), (61, 3), (100, 4), (122, 5), (180, 89), (300, 90)]:
            clock[0] = 1000.0 + at
            bar.update(done - bar.n)
    lines = capsys.readouterr().err.splitlines()
    # 61 s: 3 done at 61/3 = 20.33 s an episode, 87 left = 29:29; 122 s (61 s after the last line): 5 done,
    # 24.40 s each, 85 left = 34:34; 180 s is 58 s after that (none); 300 s finishes (none).
    assert lines == ["validation (step 0):   3% 3/90 [01:01<29:29, 20.33s/ep]",
                     "validation (step 0):   6% 5/90 [02:02<34:34, 24.40s/ep]"]


def test_an_iterated_bar_counts_from_where_a_resumed_run_starts(clock, capsys):
    seen = []
    bar = progress.progress_bar(range(4, 10), desc="RL", unit="step", initial=4, total=10)
    assert bar.disable  # the trainer's lines are printed directly, not above a bar
    for step in bar:
        seen.append(step)
        clock[0] += 70.0
        bar.set_postfix(success="0.50")
    assert seen == [4, 5, 6, 7, 8, 9]
    lines = capsys.readouterr().err.splitlines()
    # One line after each of steps 5..9 but the last (the counts 5..9 of 10), each 70 s after the one
    # before; the rate counts the steps this process ran: after step 5, 1 in 70 s, 5 left = 5:50.
    assert lines[0] == "RL:  50% 5/10 [01:10<05:50, 70.00s/step, success=0.50]"
    assert [line.split()[2] for line in lines] == ["5/10", "6/10", "7/10", "8/10", "9/10"]


def test_work_done_before_a_bar_began_counts_in_its_total_but_not_its_rate(clock, capsys):
    bar = progress.progress_bar(total=69, desc="eval", unit="ep")
    progress.count_as_done(bar, 18)  # read back from a journal at once
    clock[0] += 200.0
    bar.update(2)
    # 20 of 69 done, 2 of them here in 200 s: 100 s each, 49 left = 1:21:40 (counting the 18 as played:
    # 10 s each, 8:10).
    assert capsys.readouterr().err.splitlines() == ["eval:  29% 20/69 [03:20<1:21:40, 100.00s/ep]"]


def test_work_done_before_a_tqdm_bar_began_stays_out_of_its_smoothed_rate():
    import io

    from tqdm import tqdm

    bar = tqdm(total=69, unit="ep", file=io.StringIO(), mininterval=0, smoothing=1)
    now = [0.0]
    bar._time, bar.start_t, bar.last_print_t = (lambda: now[0]), 0.0, 0.0
    progress.count_as_done(bar, 18)
    now[0] = 200.0
    bar.update(2)
    # 2 played in 200 s: 100 s each (counting the 18: 10 s each).
    assert "20/69 [03:20<1:21:40, 100.00s/ep]" in str(bar)


def test_a_disabled_bar_writes_nothing(clock, capsys):
    with progress.progress_bar(total=3, disable=True) as bar:
        clock[0] += 500
        bar.update()
    assert capsys.readouterr().err == ""
