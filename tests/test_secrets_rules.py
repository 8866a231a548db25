"""The secret rule's edges, one behaviour per test: found by mutation testing (``bench/mutation.py``),
where each of these changes to ``autotune/secrets.py`` passed the rest of the suite."""

from __future__ import annotations

import pytest

from autotune.secrets import MASK, Piece, SecretRule, env_name

TOKEN = "ghp_abcdefghijklmnopqrstuvwxyz0123"  # a GitHub token's format


@pytest.mark.parametrize(
    ("name", "var"),
    [
        ("--hf_token_", "HF_TOKEN"),  # separators at the end go too
        ("X_TOKEN", "X_TOKEN"),  # only separators are stripped, not letters
        ("--9lives_token", "_9LIVES_TOKEN"),  # a variable cannot start with a digit
        ("a9_token", "A9_TOKEN"),  # ... a digit later is fine
    ],
)
def test_env_name_edges(name: str, var: str) -> None:
    assert env_name(name) == var


def test_declared_names_match_whatever_separators_surround_them() -> None:
    assert SecretRule(["my-pass"]).is_secret_name("--my-pass-")
    assert SecretRule(["xmine"]).is_secret_name("XMINE")
    assert not SecretRule(["xmine"]).is_secret_name("MINE")


def test_autotune_s_own_option_and_an_empty_name_are_not_secret_names() -> None:
    assert not SecretRule().is_secret_name("--secret-arg")
    assert not SecretRule().is_secret_name("--")


def test_known_values_keep_six_characters_or_more_longest_first() -> None:
    rule = SecretRule(values=["abc", "true", "tok123", "a-tok123-b"])
    assert rule.values == ("a-tok123-b", "tok123")
    # the longer value is masked whole, not around a shorter one inside it
    assert rule.mask("x a-tok123-b y tok123") == f"x {MASK} y {MASK}"


def test_several_declared_names_are_each_secret() -> None:
    rule = SecretRule(["alpha-pass", "beta-pass"])
    assert rule.mask("--alpha-pass=abcdef1 --beta-pass abcdef2") == f"--alpha-pass={MASK} --beta-pass {MASK}"


def test_for_environment_reads_our_own_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_TEST_TOKEN", "zz-secret-77")
    assert SecretRule.for_environment().mask("got zz-secret-77") == f"got {MASK}"


def test_learning_takes_secret_argv_values_and_secret_looking_env_values() -> None:
    rule = SecretRule().learning(["--hf_token", "abcdef99"], env={"PLAIN": TOKEN, "OTHER": "plain-value"})
    assert set(rule.values) == {"abcdef99", TOKEN}


def test_looks_secret_inside_lists_mappings_and_strings() -> None:
    rule = SecretRule(values=["mysecret1"])
    assert rule.looks_secret(["x", TOKEN]) and rule.looks_secret(("x", TOKEN))
    assert rule.looks_secret({"a": {"b": TOKEN}})
    assert rule.looks_secret("postgresql://u:pw123456@h/db")
    assert rule.looks_secret("a mysecret1 b")
    assert not rule.looks_secret(["x", "y"]) and not rule.looks_secret({"a": "plain"})
    assert not rule.looks_secret("postgresql://h/db") and not rule.looks_secret("nothing here")
    assert not rule.looks_secret(12345678) and not rule.looks_secret(None)


def test_script_words_name_the_variable_of_each_secret_piece() -> None:
    rule = SecretRule(values=["abcdef99"])
    argv = [
        "train.py",
        "--storage",
        "postgresql://bob:pw123456@db/x",  # a URL password: <flag>_PASSWORD
        "postgresql://eve:pw654321@db/y",  # the previous item was a value: still the flag's
        "--note=abcdef99-and-abcdef99",  # a known value, twice, owned by --note
        "abcdef99",  # at the start of an item, after a flag that took a value: the flag's
        "",
    ]
    words, used = rule.script_words(argv)
    assert words == [
        "train.py",
        "--storage",
        'postgresql://bob:"${STORAGE_PASSWORD}"@db/x',
        'postgresql://eve:"${STORAGE_PASSWORD}"@db/y',
        '--note="${NOTE}"-and-"${NOTE}"',
        '"${NOTE}"',
        "''",
    ]
    assert used == ["STORAGE_PASSWORD", "NOTE"]
    assert rule.script_line(argv) == " ".join(words)


def test_secrets_without_an_owning_flag_get_generic_variables() -> None:
    words, used = SecretRule(values=["abcdef99"]).script_words(
        ["postgresql://bob:pw123456@db/x", "abcdef99", f"pre-{TOKEN}"]
    )
    assert words == ['postgresql://bob:"${URL_PASSWORD}"@db/x', '"${SECRET}"', 'pre-"${SECRET}"']
    assert used == ["URL_PASSWORD", "SECRET"]


def test_a_lone_dash_after_a_secret_flag_is_its_value() -> None:
    # "-" and "--" are not flags: after --hf_token they are what the flag holds
    assert SecretRule().redact_argv(["--hf_token", "-"]) == ("--hf_token", MASK)
    assert SecretRule().redact_argv(["--hf_token", "--"]) == ("--hf_token", MASK)
    assert SecretRule().redact_argv(["--hf_token", "--other"]) == ("--hf_token", "--other")
    assert SecretRule().redact_argv(["--hf_token", "-5"]) == ("--hf_token", MASK)  # a negative number


def test_redact_env_masks_secret_names_unless_the_value_is_a_flag_word() -> None:
    env = {"HF_TOKEN": "true", "PLAIN": "abcdef", "WANDB_API_KEY": "k-123456", "URL": "http://u:pw9999@h"}
    assert SecretRule().redact_env(env) == {
        "HF_TOKEN": "true",
        "PLAIN": "abcdef",
        "WANDB_API_KEY": MASK,
        "URL": f"http://u:{MASK}@h",
    }


def test_redact_mapping_keeps_absent_and_boolean_secret_values() -> None:
    args = {"hub_token": None, "api_key": True, "hf_token": "abcdef12", "plain": ["x", TOKEN], "n": 3}
    assert SecretRule().redact_mapping(args) == {
        "hub_token": None,
        "api_key": True,
        "hf_token": MASK,
        "plain": ["x", MASK],
        "n": 3,
    }
    assert SecretRule().mask_value(("x", TOKEN)) == ("x", MASK)
    assert SecretRule().mask_value({"hf_token": "abcdef12"}) == {"hf_token": MASK}


def test_mask_of_nothing_and_of_autotune_s_own_option() -> None:
    rule = SecretRule()
    assert rule.mask(None) == "" and rule.mask("") == ""
    # --secret-arg names a secret, it does not hold one
    assert rule.mask("--secret-arg HF_TOKEN") == "--secret-arg HF_TOKEN"
    assert rule.mask("secret_arg=HF_TOKEN") == "secret_arg=HF_TOKEN"


def test_quoted_and_flag_word_values() -> None:
    rule = SecretRule()
    assert rule.mask("HF_TOKEN='abcdef'") == f"HF_TOKEN='{MASK}'"
    assert rule.mask("HF_TOKEN=''") == f"HF_TOKEN='{MASK}'"
    assert rule.mask("HF_TOKEN=true") == "HF_TOKEN=true"
    assert rule.mask(f"HF_TOKEN={MASK}") == f"HF_TOKEN={MASK}"


def test_redact_url() -> None:
    rule = SecretRule()
    assert rule.redact_url(None) is None
    assert rule.redact_url("postgresql://bob:pw123456@db/x") == f"postgresql://bob:{MASK}@db/x"
    assert rule.redact_url("sqlite:///x.db") == "sqlite:///x.db"


def test_a_value_starting_and_ending_with_one_letter_is_masked_whole() -> None:
    # only a quote pair is kept around the mask; a letter pair is part of the secret
    assert SecretRule().mask("--hf_token Xabc123X") == f"--hf_token {MASK}"


def test_a_token_after_a_plain_flag_is_read_from_that_flags_variable() -> None:
    assert SecretRule().script_words(["--push_to", TOKEN]) == (["--push_to", '"${PUSH_TO}"'], ["PUSH_TO"])


def test_a_url_password_is_named_after_the_flag_before_any_equals_sign() -> None:
    words, used = SecretRule().script_words(["--report=a=b", "postgresql://u:pw@h/db"])
    assert used == ["REPORT_PASSWORD"]
    assert words[1] == 'postgresql://u:"${REPORT_PASSWORD}"@h/db'


def test_every_occurrence_of_a_known_value_is_masked() -> None:
    rule = SecretRule(values=["s3cr3t-value"])
    assert rule.redact_argv(["a=s3cr3t-value,s3cr3t-value,s3cr3t-value"]) == (f"a={MASK},{MASK},{MASK}",)


def test_a_known_value_with_a_token_inside_is_masked_whole_and_later_secrets_too() -> None:
    value = "mypre-hf_" + "a" * 25 + "-post"  # a token format inside a longer known secret
    rule = SecretRule(values=[value])
    assert rule.redact_argv([f"x={value},{TOKEN}"]) == (f"x={MASK},{MASK}",)


def test_pieces_hold_no_empty_literal_around_a_secret() -> None:
    assert SecretRule().pieces([TOKEN]) == [[Piece(TOKEN, "SECRET")]]


def test_only_the_item_right_after_a_secret_flag_is_its_value() -> None:
    rule = SecretRule()
    assert rule.redact_argv(["--hf_token", "tok123456", "train.jsonl"]) == ("--hf_token", MASK, "train.jsonl")
    # an empty assigned value is no secret, and it does not make the next item one
    assert rule.redact_argv(["--hf_token=", "train.jsonl"]) == ("--hf_token=", "train.jsonl")


def test_a_value_assigned_to_a_secret_name_is_learned_for_later_text() -> None:
    rule = SecretRule().learning(["--hf_token=abcdef123"])
    assert rule.mask("log: abcdef123 sent") == f"log: {MASK} sent"


def test_declaring_a_suffix_of_autotunes_own_option_leaves_that_option_alone() -> None:
    # ``--secret-args hf_token`` names a secret; declaring "args" secret must not mask that name
    rule = SecretRule(["args"])
    assert not rule.is_secret_name("--secret_args")
    assert rule.mask("--secret_args hf_token") == "--secret_args hf_token"
    assert rule.mask("secret_args: hf_token") == "secret_args: hf_token"
    assert rule.mask("--my_args abcdef12") == f"--my_args {MASK}"  # the declared name itself still is
