"""``fedshift sweep --dry-run``: the planned runs, what the sweep would do with each, and
nothing run or written."""

from __future__ import annotations

from fedshift.cli import main


def test_dry_run_lists_every_planned_run_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", "-a", "fedavg,fedadam", "-t", "mnistm,syn", "--seeds", "0,1"]
    argv += ["--out", str(out), "--grid", "algo.server_lr=0.1,0.01", "--dry-run"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    # fedavg: 2 targets x 2 seeds; fedadam: x 2 grid values (the grid key is fedadam's)
    assert len(lines) == 4 + 8 + 1
    assert lines[0].split()[:2] == ["start", "fedavg-mnistm-s0"]
    assert "fedadam-syn-s1@algo.server_lr=0.01" in lines[-2]
    assert "algo.server_lr=0.01" in lines[-2] and "rounds=30" in lines[-2]
    assert lines[-1].startswith("sweep --dry-run: 12 runs planned (12 start)")
    assert not out.exists()


def test_dry_run_says_which_runs_are_finished_or_resumed(tmp_path, capsys):
    out = tmp_path / "sweep"
    (out / "fedavg-mnistm-s0").mkdir(parents=True)
    (out / "fedavg-mnistm-s0" / "summary.json").write_text("{}")
    (out / "fedavg-mnistm-s1").mkdir()
    (out / "fedavg-mnistm-s1" / "checkpoint.pt").write_bytes(b"")
    argv = ["sweep", "-a", "fedavg", "-t", "mnistm", "--seeds", "0,1,2"]
    assert main([*argv, "--out", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["finished", "resume", "start"]
    assert "(1 finished, 1 resume, 1 start)" in lines[-1]
    assert sorted(p.name for p in out.iterdir()) == ["fedavg-mnistm-s0", "fedavg-mnistm-s1"]


def test_dry_run_still_checks_every_configuration(tmp_path, capsys):
    argv = ["sweep", "-a", "nosuch", "-t", "mnistm", "--out", str(tmp_path), "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedshift: error: unknown algorithm 'nosuch'")
    assert "Traceback" not in err
