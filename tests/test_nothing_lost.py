"""Issue 30's rules, checked in process (the CLI checks are in tests/cli/test_nothing_lost_cli.py): a study
bound to its storage, --out, the space schema, guarded reads, terminal text, bounded launches."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.errors import SpaceError, StudyError, UsageError, WriteError
from autotune.plaintext import plain
from autotune.records import StepMetrics, TrialResult, TrialStatus
from autotune.secrets import SecretRule
from autotune.space import load_space
from autotune.study.binding import UID_ATTR, bind_storage, bound_name, claim_number, study_uid
from autotune.study.storage import storage_error
from autotune.studydir import StudyDir, ensure_study_out, write_json_atomic
from autotune.studysettings import StudySettings
from autotune.trial.execute import MAX_ARG_BYTES, argv_too_long
from autotune.trial.steady import step_durations

ROOT = Path(__file__).resolve().parents[1]


def _space(tmp_path: Path, knob: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(f"backend: command\nknobs:\n  bs: {knob}\n")
    return path


def _result(number: int, status: TrialStatus = TrialStatus.COMPLETE, bs: int = 1) -> TrialResult:
    return TrialResult(number=number, params={"bs": bs}, status=status, reason="x")


# -- a study bound to its storage ---------------------------------------------------------------------


def test_a_lost_storage_is_rebuilt_with_the_same_numbers(tmp_path: Path) -> None:
    sd = StudyDir(tmp_path)
    space = load_space(_space(tmp_path, "{type: int, choices: [1, 2, 3], default: 1}"))
    for n, status in ((0, TrialStatus.COMPLETE), (2, TrialStatus.OOM), (3, TrialStatus.RUNNING)):
        sd.write_result(_result(n, status, bs=1 + n % 3))
    study = optuna.create_study(direction="maximize")
    bound = bind_storage(study, sd, "u1", shared=False, space=space, attrs=lambda r: {}, where="mem")
    assert bound.rebuilt == 3 and bound.uid == "u1"
    states = [t.state for t in study.get_trials()]
    assert states == [
        optuna.trial.TrialState.FAIL,  # 0: COMPLETE without a throughput is not a value
        optuna.trial.TrialState.FAIL,  # 1: a number with no directory (a duplicate)
        optuna.trial.TrialState.FAIL,  # 2: OOM
        optuna.trial.TrialState.RUNNING,  # 3: recovered on resume like any trial a killed run left
    ]
    assert study.get_trials()[2].params == {"bs": 3}
    assert study.user_attrs[UID_ATTR] == "u1"
    # the next number the storage gives is after the last directory
    assert study.ask().number == 4


def test_a_storage_of_another_study_or_that_lost_some_trials_is_refused(tmp_path: Path) -> None:
    sd = StudyDir(tmp_path)
    space = load_space(_space(tmp_path, "{type: int, choices: [1, 2], default: 1}"))
    sd.write_result(_result(0))
    sd.write_result(_result(1))
    other = optuna.create_study()
    other.set_user_attr(UID_ATTR, "someone-else")
    with pytest.raises(UsageError, match="another study directory"):  # an outside --storage
        bind_storage(other, sd, "mine", shared=False, own=False, space=space, attrs=lambda r: {}, where="x")
    # workers joining one study (each maybe with its own directory) take the storage's uid
    for _ in range(2):
        other.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    joined = bind_storage(other, sd, "mine", shared=True, space=space, attrs=lambda r: {}, where="x")
    assert joined.uid == "someone-else"
    partial = optuna.create_study()
    partial.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL))
    with pytest.raises(UsageError, match="holds 1 trial"):
        bind_storage(partial, sd, "mine", shared=False, space=space, attrs=lambda r: {}, where="x")
    with pytest.raises(UsageError, match="holds 0 trial"):  # workers could rebuild it twice
        bind_storage(
            optuna.create_study(), sd, "mine", shared=True, space=space, attrs=lambda r: {}, where="x"
        )


def test_a_number_whose_directory_holds_a_result_is_never_written(tmp_path: Path) -> None:
    sd = StudyDir(tmp_path)
    sd.write_result(_result(0))
    before = sd.trial(0).result_json.read_bytes()
    study = optuna.create_study()
    trial = study.ask()
    with pytest.raises(StudyError, match="out of step"):
        claim_number(sd, study, trial)
    assert sd.trial(0).result_json.read_bytes() == before
    assert study.get_trials()[0].state is optuna.trial.TrialState.FAIL


def test_the_recorded_name_and_uid_are_kept(tmp_path: Path) -> None:
    sd = StudyDir(tmp_path / "renamed")
    assert bound_name(sd, StudySettings(name="a"), None) == "a"
    assert bound_name(sd, StudySettings(name="a"), "a") == "a"
    assert bound_name(sd, None, "x") == "x"
    with pytest.raises(UsageError, match="is the study 'a'"):
        bound_name(sd, StudySettings(name="a"), "b")
    assert study_uid(StudySettings(uid="abc")) == "abc"
    assert study_uid(StudySettings()) != study_uid(None)


# -- --out --------------------------------------------------------------------------------------------


def test_out_takes_a_new_or_empty_directory_or_a_study(tmp_path: Path) -> None:
    ensure_study_out(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    ensure_study_out(tmp_path / "empty")
    early = tmp_path / "early"  # killed before study.json was written
    (early / "trials").mkdir(parents=True)
    (early / "study.db").write_bytes(b"")
    ensure_study_out(early)
    study = tmp_path / "study"
    study.mkdir()
    (study / "study.json").write_text("{}")
    (study / "report.md").write_text("ours")
    ensure_study_out(study)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("x")
    with pytest.raises(UsageError, match=r"neither empty nor a study: it holds \.bashrc"):
        ensure_study_out(home)
    (home / "best").mkdir()
    with pytest.raises(UsageError, match="autotune would replace best"):
        ensure_study_out(home)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(UsageError):
        ensure_study_out(a_file)


# -- guarded reads ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said"),
    [("[]", "a list"), ("null", "null"), ('"x"', "a string"), ("{", "not valid JSON")],
)
def test_study_json_that_is_not_an_object_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    (tmp_path / "study.json").write_text(text)
    with pytest.raises(UsageError, match=said) as caught:
        StudyDir(tmp_path).read_settings()
    assert "study.json" in caught.value.one_line()


def test_a_bad_stored_recommendation_is_one_line(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "study.json", {"recommendation": {"trial": "x"}})
    with pytest.raises(UsageError, match="its recommendation is not one"):
        StudyDir(tmp_path).recommendation()


def test_a_read_only_storage_is_a_write_failure() -> None:
    err = storage_error(
        "sqlite:///x/study.db", Exception("attempt to write a readonly database"), SecretRule()
    )
    assert isinstance(err, WriteError) and err.exit_code == 74
    assert "--storage" not in err.one_line()
    missing = storage_error(
        "sqlite:///nope/study.db", Exception("unable to open database file"), SecretRule()
    )
    assert missing.exit_code == 2


# -- the space schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("knob", "said"),
    [
        ("{type: float, low: 0.0, high: .inf, default: 0.0}", "not a finite number"),
        ("{type: float, low: 0.0, high: 1.0, step: .nan, default: 0.0}", "not a finite number"),
        ('{type: str, choices: ["a\\e]0;x\\a"], default: a}', "control character"),
        ("{type: int, choices: [" + ", ".join(map(str, range(300))) + "], default: 0}", "300 choices"),
    ],
)
def test_space_values_are_bounded_and_plain(tmp_path: Path, knob: str, said: str) -> None:
    with pytest.raises(SpaceError, match=said):
        load_space(_space(tmp_path, knob))


def test_a_duplicate_key_or_a_control_byte_in_a_space_file_is_one_line(tmp_path: Path) -> None:
    twice = tmp_path / "twice.yaml"
    twice.write_text(
        "knobs:\n  bs: {type: int, choices: [1], default: 1}\n  bs: {type: int, choices: [2], default: 2}\n"
    )
    with pytest.raises(SpaceError, match=r"names 'bs' twice .*line 3"):
        load_space(twice)
    control = tmp_path / "control.yaml"
    control.write_bytes(b"knobs:\n  bs: {type: int, choices: [1], default: 1}\x01\n")
    with pytest.raises(SpaceError, match=r"control character \(U\+0001 at line 2\)"):
        load_space(control)


def test_huge_ranges_are_sampled_not_expanded(tmp_path: Path) -> None:
    ints = load_space(_space(tmp_path, "{type: int, low: 1, high: 1000000000000, default: 1}"))
    values = ints["bs"].values()
    assert len(values) == 64 and values[0] == 1 and values[-1] == 1_000_000_000_000
    floats = load_space(
        _space(tmp_path, "{type: float, low: 0.0, high: 1.0, step: 0.000000000001, default: 0.0}")
    )
    values = floats["bs"].values()
    assert len(values) == 64 and values[0] == 0.0 and values[-1] == pytest.approx(1.0)


# -- text, launches, clocks ---------------------------------------------------------------------------


def test_terminal_control_sequences_are_stripped() -> None:
    assert plain("boom \x1b]0;pwned\x07 after") == "boom  after"
    assert plain("a\x1b[31mred\x1b[0m \x9d2;t\x07b") == "ared b"
    assert plain("tabs\tand\nnewlines stay") == "tabs\tand\nnewlines stay"


def test_an_argument_the_kernel_refuses_is_named_before_launch() -> None:
    assert argv_too_long(["python", "x" * MAX_ARG_BYTES], {}) is not None
    assert "E2BIG" in (argv_too_long(["python", "x" * MAX_ARG_BYTES], {}) or "")
    assert argv_too_long(["python", "x" * 1000], {}) is None


def test_step_stamps_closer_than_a_real_step_are_not_a_speed() -> None:
    steps = [StepMetrics(step=i, t_mono_s=100.0 + i * 1e-12, t_wall_s=0.0) for i in range(5)]
    durations, _, _ = step_durations(steps)
    assert durations == []


def test_the_docs_say_what_report_html_holds() -> None:
    template = (ROOT / "reports" / "templates" / "report.html.j2").read_text()
    readme = (ROOT / "docs" / "study-directory.md").read_text()
    has_script = "<script" in template
    assert ("no script" in readme) is not has_script
