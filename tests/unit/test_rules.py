"""The rules file: a valid one compiles; an invalid one is refused naming rule and field."""

from __future__ import annotations

import contextlib
import gc
import json
import re
import textwrap
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import yaml
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

import schemas.rules as rules_module
from schemas.rules import (
    Rule,
    RuleChanged,
    RulesError,
    Window,
    check_kept_meanings,
    counter_meaning,
    load_rules,
    parse_rules,
)

VALID = textwrap.dedent(
    """\
    rules:
      - id: acct-day-cny          # comments are fine
        scope: account_id
        window: day
        timezone: Asia/Shanghai
        currency: CNY
        max_count: 6
        max_amount: "5000.00"
      - id: card.merchant_hour-1
        scope: [card_id, merchant_id]
        window: hour
        max_count: 0
      - id: atm-week-jpy
        window: week
        currency: JPY
        max_amount: 100000
        match: {channel: [atm, kiosk], mcc: 6011, contactless: true}
      - id: single-kwd
        window: transaction
        currency: KWD
        max_amount: 1.5
        description: one payment at most 1.500 KWD
    """
)


def refusal(text: str) -> str:
    """The message ``parse_rules`` refuses ``text`` with."""
    with pytest.raises(RulesError) as caught:
        parse_rules(text)
    return str(caught.value)


def one_rule(body: str, rule_id: str = "r1") -> str:
    """A rules file of one rule with ``id: rule_id`` and the given YAML lines."""
    lines = "\n".join("    " + line for line in textwrap.dedent(body).strip().splitlines())
    return f"rules:\n  - id: {rule_id}\n{lines}\n"


# --- a valid file --------------------------------------------------------------------------


def test_a_valid_file_compiles_to_exact_rules() -> None:
    rules = parse_rules(VALID)
    assert rules.rules == (
        Rule(
            id="acct-day-cny",
            window=Window.DAY,
            scope=("account_id",),
            timezone="Asia/Shanghai",
            currency="CNY",
            max_count=6,
            max_amount=500_000,
            match=(),
        ),
        Rule(
            id="card.merchant_hour-1",
            window=Window.HOUR,
            scope=("card_id", "merchant_id"),
            timezone="UTC",
            currency=None,
            max_count=0,
            max_amount=None,
            match=(),
        ),
        Rule(
            id="atm-week-jpy",
            window=Window.WEEK,
            scope=("account_id",),
            timezone="UTC",
            currency="JPY",
            max_count=None,
            max_amount=100_000,
            match=(
                ("channel", frozenset({"atm", "kiosk"})),
                ("mcc", frozenset({"6011"})),
                ("contactless", frozenset({"true"})),
            ),
        ),
        Rule(
            id="single-kwd",
            window=Window.TRANSACTION,
            scope=("account_id",),
            timezone="UTC",
            currency="KWD",
            max_count=None,
            max_amount=1500,
            match=(),
        ),
    )


def test_the_version_is_a_hash_of_the_file() -> None:
    version = parse_rules(VALID).version
    assert len(version) == 12
    int(version, 16)
    assert parse_rules(VALID.encode()).version == version
    assert parse_rules(VALID + "# changed\n").version != version


@pytest.mark.parametrize("window", [w.value for w in Window])
def test_every_window_is_accepted(window: str) -> None:
    rules = parse_rules(one_rule(f"window: {window}\ncurrency: USD\nmax_amount: '1.00'"))
    assert rules.rules[0].window is Window(window)


def test_a_zero_amount_limit_is_allowed() -> None:
    rules = parse_rules(one_rule("window: day\ncurrency: USD\nmax_amount: '0'"))
    assert rules.rules[0].max_amount == 0


@pytest.mark.parametrize("amount", ["'0e999999999999'", "0e999999999999", "0.0E+999999999999"])
def test_a_zero_amount_limit_with_a_huge_exponent_is_read_at_once(amount: str) -> None:
    # its minor units were built as 0 * 10**exponent: `rules check`, `run` and `replay`
    # never finished reading the file
    rules = parse_rules(one_rule(f"window: day\ncurrency: USD\nmax_amount: {amount}"))
    assert rules.rules[0].max_amount == 0


@pytest.mark.parametrize(
    ("currency", "amount", "minor"),
    [("CNY", "'5000.00'", 500_000), ("JPY", "'100'", 100), ("KWD", "'0.125'", 125)],
)
def test_max_amount_is_in_minor_units_of_its_currency(
    currency: str, amount: str, minor: int
) -> None:
    rules = parse_rules(one_rule(f"window: day\ncurrency: {currency}\nmax_amount: {amount}"))
    assert rules.rules[0].max_amount == minor


def test_a_json_rules_file_is_accepted_too() -> None:
    text = '{"rules": [{"id": "r1", "window": "day", "max_count": 3}]}'
    assert parse_rules(text).rules[0].max_count == 3


def test_load_rules_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(VALID, encoding="utf-8")
    assert load_rules(str(path)) == parse_rules(VALID)


# --- invalid files: refused naming the rule and the field ---------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            one_rule("window: fortnight\nmax_count: 1", "r-window"),
            ["'r-window'", "window", "fortnight", "(one of: transaction, minute, hour, day,"],
            id="unknown-window",
        ),
        pytest.param(
            one_rule("max_count: 1", "r-nowindow"),
            ["'r-nowindow'", "window"],
            id="missing-window",
        ),
        pytest.param(
            one_rule("window: day\ntimezone: Mars/Olympus_Mons\nmax_count: 1", "r-zone"),
            ["'r-zone'", "timezone", "Mars/Olympus_Mons"],
            id="unknown-zone",
        ),
        pytest.param(
            one_rule("window: day\ntimezone: ''\nmax_count: 1", "r-zone"),
            ["'r-zone'", "timezone"],
            id="empty-zone",
        ),
        pytest.param(
            one_rule("window: day\ntimezone: ../../etc/passwd\nmax_count: 1", "r-zone"),
            ["'r-zone'", "timezone"],
            id="path-zone",
        ),
        pytest.param(
            one_rule("window: day\nmax_amount: '100.00'", "r-nocur"),
            ["'r-nocur'", "max_amount", "currency"],
            id="max_amount-without-currency",
        ),
        pytest.param(
            one_rule("window: day\ncurrency: CNY", "r-nolimit"),
            ["'r-nolimit'", "max_count", "max_amount"],
            id="neither-limit",
        ),
        pytest.param(
            one_rule("window: transaction\nmax_count: 1", "r-txn"),
            ["'r-txn'", "max_amount"],
            id="transaction-needs-amount",
        ),
        pytest.param(
            one_rule(
                "window: transaction\ncurrency: CNY\nmax_amount: '100.00'\nmax_count: 0",
                "r-txn-count",
            ),
            ["'r-txn-count'", "max_count: a transaction window counts nothing"],
            id="transaction-counts-nothing",
        ),
        pytest.param(
            one_rule("window: day\nmax_count: 1", "'r 1!'"),
            ["'r 1!'", "id"],
            id="id-characters",
        ),
        pytest.param(
            one_rule("window: day\nmax_count: 1", "a|b"),
            ["'a|b'", "id"],
            id="id-with-pipe",
        ),
        pytest.param(
            one_rule("window: day\nmax_count: 1", "x" * 65),
            ["x" * 65, "id"],
            id="id-too-long",
        ),
        pytest.param(
            "rules:\n  - window: day\n    max_count: 1\n",
            ["rules[0]", "id"],
            id="missing-id",
        ),
        pytest.param(
            one_rule("window: day\nmax_count: 1\nmax_cnt: 3", "r-key"),
            ["'r-key'", "max_cnt"],
            id="unknown-key",
        ),
        pytest.param(
            one_rule("window: day\nmax_count: -1", "r-neg"),
            ["'r-neg'", "max_count", ">= 0"],
            id="negative-max_count",
        ),
        pytest.param(
            one_rule("window: day\nmax_count: 1.5", "r-frac"),
            ["'r-frac'", "max_count"],
            id="fractional-max_count",
        ),
        pytest.param(
            one_rule("window: day\nmax_count: yes", "r-bool"),
            ["'r-bool'", "max_count"],
            id="boolean-max_count",
        ),
        pytest.param(
            one_rule("window: day\ncurrency: CNY\nmax_amount: '10.005'", "r-digits"),
            ["'r-digits'", "max_amount", "fraction digit"],
            id="too-many-fraction-digits",
        ),
        pytest.param(
            one_rule("window: day\ncurrency: CNY\nmax_amount: 10.005", "r-digits"),
            ["'r-digits'", "max_amount", "fraction digit"],
            id="too-many-fraction-digits-number",
        ),
        pytest.param(
            one_rule("window: day\ncurrency: JPY\nmax_amount: '100.5'", "r-jpy"),
            ["'r-jpy'", "max_amount", "fraction digit"],
            id="jpy-fraction",
        ),
        pytest.param(
            one_rule("window: day\ncurrency: CNY\nmax_amount: '-1.00'", "r-negamt"),
            ["'r-negamt'", "max_amount", ">= 0"],
            id="negative-max_amount",
        ),
        pytest.param(
            one_rule("window: day\ncurrency: CNY\nmax_amount: lots", "r-text"),
            ["'r-text'", "max_amount"],
            id="max_amount-not-a-number",
        ),
        pytest.param(
            one_rule("window: day\ncurrency: XYZ\nmax_count: 1", "r-cur"),
            ["'r-cur'", "currency", "XYZ"],
            id="unknown-currency",
        ),
        pytest.param(
            one_rule("window: day\ncurrency: cny\nmax_count: 1", "r-cur"),
            ["'r-cur'", "currency"],
            id="lower-case-currency",
        ),
        pytest.param(
            one_rule("window: day\nscope: []\nmax_count: 1", "r-scope"),
            ["'r-scope'", "scope"],
            id="empty-scope",
        ),
        pytest.param(
            one_rule("window: day\nscope: 'card id'\nmax_count: 1", "r-scope"),
            ["'r-scope'", "scope", "'card id'"],
            id="bad-scope-field",
        ),
        pytest.param(
            one_rule("window: day\nscope: [card_id, card_id]\nmax_count: 1", "r-scope"),
            ["'r-scope'", "scope"],
            id="repeated-scope-field",
        ),
        pytest.param(
            'rules:\n  - {id: "day\\n", window: day, max_count: 1}\n',
            ["'day\\n'", "id"],
            id="id-ending-in-a-newline",
        ),
        pytest.param(
            one_rule('window: day\nscope: "card_id\\n"\nmax_count: 1', "r-scope"),
            ["'r-scope'", "scope", "'card_id\\n'"],
            id="scope-field-ending-in-a-newline",
        ),
        pytest.param(
            one_rule("window: day\nmatch: {channel: []}\nmax_count: 1", "r-match"),
            ["'r-match'", "match", "channel"],
            id="match-without-values",
        ),
        pytest.param(  # msgspec wrote match[...][1]: which of the rule's match fields?
            one_rule("window: day\nmatch: {channel: [atm], mcc: [6011, null]}\nmax_count: 1"),
            ["'r1'", 'match["mcc"][1]', "null"],
            id="match-value-not-a-scalar",
        ),
        pytest.param(
            one_rule("window: day\nmatch: {channel: atm, mcc: {6011: x}}\nmax_count: 1"),
            ["'r1'", 'match["mcc"]', "object"],
            id="match-values-a-mapping",
        ),
        pytest.param(
            one_rule("window: day\nmatch: [channel]\nmax_count: 1", "r-match"),
            ["'r-match'", "match"],
            id="match-not-a-mapping",
        ),
    ],
)
def test_an_invalid_rule_is_refused_naming_rule_and_field(text: str, expected: list[str]) -> None:
    message = refusal(text)
    for part in expected:
        assert part in message
    assert "\n" not in message


def test_a_duplicate_id_is_refused() -> None:
    text = (
        "rules:\n"
        "  - {id: same, window: day, max_count: 1}\n"
        "  - {id: other, window: day, max_count: 1}\n"
        "  - {id: same, window: hour, max_count: 2}\n"
    )
    assert refusal(text) == "rule 'same': id: used by more than one rule"


def test_the_error_names_the_rule_that_is_wrong_not_the_first() -> None:
    text = (
        "rules:\n"
        "  - {id: good, window: day, max_count: 1}\n"
        "  - {id: bad, window: fortnight, max_count: 1}\n"
    )
    message = refusal(text)
    assert "'bad'" in message
    assert "rules[1]" in message
    assert "'good'" not in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("rules: []\n", "rules: the file defines no rules", id="empty-list"),
        pytest.param("rules:\n", "`$.rules`", id="null-rules"),
        pytest.param("", "rules file is empty: it needs a 'rules:' list", id="empty-file"),
        pytest.param(
            "- id: r1\n  window: day\n",
            "rules file holds a list, not a mapping: it needs a 'rules:' list",
            id="top-level-list",
        ),
        pytest.param("just text\n", "rules file holds a string, not a mapping", id="string"),
        pytest.param(
            "rules: [{id: r1, window: day, max_count: 1}]\nversion: 2\n",
            "version",
            id="unknown-top-level-key",
        ),
    ],
)
def test_a_file_without_usable_rules_is_refused(text: str, expected: str) -> None:
    assert expected in refusal(text)


@pytest.mark.parametrize(
    "text", ["rules: [\n", "rules:\n  - id: r1\n   window: day\n", "rules: {a: 1\n", "\t- x"]
)
def test_invalid_yaml_is_refused_in_one_line(text: str) -> None:
    # the CLI prints this message as its one-line reason
    message = refusal(text)
    assert message.startswith("not valid YAML: ")
    assert "\n" not in message
    assert "line " in message


def test_non_utf8_rules_file_is_refused_in_one_line() -> None:
    with pytest.raises(RulesError) as caught:
        parse_rules(b"rules:\n  - id: caf\xe9\n")
    assert "\n" not in str(caught.value)


def test_an_unreadable_file_is_a_rules_error(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(RulesError) as caught:
        load_rules(str(missing))
    assert str(caught.value) == f"cannot read rules file {missing}: No such file or directory"


def test_a_directory_is_an_unreadable_rules_file(tmp_path: Path) -> None:
    with pytest.raises(RulesError) as caught:
        load_rules(str(tmp_path))
    assert str(caught.value).startswith(f"cannot read rules file {tmp_path}: ")


def test_load_rules_refuses_an_invalid_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(one_rule("window: day"), encoding="utf-8")
    with pytest.raises(RulesError, match=r"'r1'.*max_count"):
        load_rules(str(path))


def test_host_clock_alias_is_not_an_iana_zone() -> None:
    with pytest.raises(RulesError, match=r"rule 'a': timezone: 'localtime'"):
        parse_rules("rules: [{id: a, window: day, max_count: 1, timezone: localtime}]")


def test_a_limit_beyond_15_digits_in_minor_units_is_refused_by_name() -> None:
    with pytest.raises(RulesError, match=r"rule 'r1': max_amount: .* too large"):
        parse_rules(
            'rules:\n  - {id: r1, window: day, currency: CNY, max_amount: "99999999999999999.00"}\n'
        )


@pytest.mark.parametrize(
    "line",
    [
        'max_amount: "1e99999999999999999999"',
        "max_amount: 1.0e+1000000000000000000",
        "max_count: 1.0e+1000000000000000000",
        "max_count: 1\nmatch: {mcc: [1.0e+1000000000000000000]}",
    ],
)
def test_a_number_no_decimal_holds_is_refused_by_name_not_a_crash(line: str) -> None:
    # Decimal raised InvalidOperation for an exponent of 10**18 or more: `rules check`
    # and every command reading the file ended in a traceback
    message = refusal(one_rule(f"window: day\ncurrency: CNY\n{line}"))
    field = "match.mcc" if "match" in line else line.split(":")[0]
    assert message.startswith(f"rule 'r1': {field}: ")
    assert "too large" in message or "no decimal holds an exponent of 10^18 or more" in message


# --- YAML 1.1 readings that are not what the file says -----------------------------------


@pytest.mark.parametrize(
    ("value", "reading"),
    [
        ("NO", "false"),  # Norway
        ("yes", "true"),
        ("off", "false"),
        ("0742", "482"),  # an MCC, read as octal
        ("0780", "780"),  # an MCC: text to YAML 1.1, the number 780 to YAML 1.2 and JSON
        ("08", "8"),
        ("0o17", "15"),  # a YAML 1.2 octal
        ("1_000", "1000"),
        ("0x1F", "31"),
        ("1:30", "90"),  # sexagesimal
        ("1_000.5", "a float"),
        (".inf", "a float"),
        ("-.Inf", "a float"),
        (".NaN", "a float"),
        ("1:30.5", "a float"),
    ],
)
def test_a_match_value_yaml_would_silently_change_is_refused(value: str, reading: str) -> None:
    message = refusal(one_rule(f"window: day\nmax_count: 1\nmatch: {{code: [SE, {value}]}}"))
    assert message.startswith(f"rule 'r1': match.code: {value} would be read as {reading}")
    assert "line 5" in message


def test_a_number_with_an_exponent_is_a_number_as_json_and_yaml_1_2_read_it() -> None:
    # PyYAML (YAML 1.1) took 6.011e3 for the text "6.011e3": the rule never matched the
    # event number 6011, and a limit meant to stop cash withdrawals stopped none
    rule = parse_rules(
        one_rule("window: day\nmax_count: 0\nmatch: {mcc: [6.011e3, 1e3, 5E0, 7., -2e-0]}")
    ).rules[0]
    assert dict(rule.match) == {"mcc": frozenset({"6011", "1000", "5", "7", "-2"})}
    assert parse_rules(one_rule("window: day\nmax_count: 1e1")).rules[0].max_count == 10
    limits = parse_rules(one_rule("window: day\ncurrency: CNY\nmax_amount: 5e3", "1e3"))
    assert limits.rules[0].id == "1e3"  # an id is its text, as for id: 1.10
    assert limits.rules[0].max_amount == 500000


def test_quoted_and_plain_values_that_mean_their_text_are_kept() -> None:
    rules = parse_rules(
        one_rule(
            "window: day\ncurrency: CNY\nmax_count: 1\nmax_amount: 5000.10\n"
            "match: {country: ['NO', SE], mcc: ['0742', 5411, 6011.0, 0],"
            " atm: [true, False], day: [2026-01-01]}"
        )
    ).rules[0]
    assert rules.max_amount == 500010
    assert dict(rules.match) == {
        "country": frozenset({"NO", "SE"}),
        "mcc": frozenset({"0742", "5411", "6011", "0"}),
        "atm": frozenset({"true", "false"}),
        "day": frozenset({"2026-01-01"}),
    }


def test_a_float_limit_is_read_exactly() -> None:
    rules = parse_rules(
        one_rule("window: day\ncurrency: KWD\nmax_amount: 1234567890.123", "exact")
    ).rules[0]
    assert rules.max_amount == 1234567890123


@pytest.mark.parametrize(
    "text",
    [
        "rules:\n  - {id: strict, window: day, max_count: 1}\n"
        "rules:\n  - {id: loose, window: day, max_count: 100}\n",
        one_rule("window: day\nmax_count: 1\nmax_count: 100"),
        one_rule("window: day\nmax_count: 1\nmatch: {channel: [atm], channel: [pos]}"),
    ],
    ids=["rules-twice", "max_count-twice", "match-field-twice"],
)
def test_a_key_written_twice_is_refused_not_overwritten(text: str) -> None:
    message = refusal(text)
    assert "is written twice in one mapping" in message
    assert "line " in message


def test_merge_keys_work_and_may_be_overridden() -> None:
    # the duplicate-key check first refused every merge key ("no constructor for merge")
    rules = parse_rules(
        "rules:\n"
        "  - &base {id: a, window: day, max_count: 1, match: {channel: [atm]}}\n"
        "  - <<: *base\n"
        "    id: b\n"
        "    window: month\n"
    ).rules
    assert [(r.id, r.window.value, r.max_count) for r in rules] == [
        ("a", "day", 1),
        ("b", "month", 1),
    ]
    assert rules[1].match == rules[0].match


def test_an_unhashable_key_is_a_one_line_refusal() -> None:
    message = refusal(one_rule("window: day\nmax_count: 1\n? [x, y]\n: 1"))
    assert "unhashable" in message and "\n" not in message


def test_a_float_outside_match_keeps_its_text() -> None:
    # "1.10" as the rule id is what was written; its value's text would be "1.1"
    rule = parse_rules(one_rule("window: day\nmax_count: 1", "1.10")).rules[0]
    assert rule.id == "1.10"


def test_a_key_yaml_would_read_as_something_else_is_refused_by_name() -> None:
    message = refusal(one_rule("window: day\nmax_count: 1\nmatch: {yes: [a]}"))
    assert message.startswith("rule 'r1': match: yes would be read as true")


def test_a_rule_s_counters_of_a_window_mean_its_zone_currency_and_scope() -> None:
    kept = dict(counter_meaning(r) or (r.id, None) for r in parse_rules(VALID).rules)
    assert kept == {
        "acct-day-cny:day": '{"timezone":"Asia/Shanghai","currency":"CNY","scope":["account_id"]}',
        "card.merchant_hour-1:hour": '{"timezone":"UTC","currency":null,'
        '"scope":["card_id","merchant_id"]}',
        "atm-week-jpy:week": '{"timezone":"UTC","currency":"JPY","scope":["account_id"]}',
        "single-kwd": None,  # a transaction rule keeps no counters
    }
    lifetime = parse_rules("rules: [{id: l, window: lifetime, timezone: Asia/Tokyo, max_count: 1}]")
    assert counter_meaning(lifetime.rules[0]) == (  # one period, in any zone
        "l:lifetime",
        '{"timezone":null,"currency":null,"scope":["account_id"]}',
    )


def test_a_zone_renamed_to_another_name_of_it_is_not_a_change() -> None:
    kept = dict(filter(None, map(counter_meaning, parse_rules(VALID).rules)))
    kept["acct-day-cny:day"] = kept["acct-day-cny:day"].replace("Asia/Shanghai", "PRC")
    kept["card.merchant_hour-1:hour"] = kept["card.merchant_hour-1:hour"].replace(
        '"UTC"', '"Etc/Zulu"'
    )
    check_kept_meanings(parse_rules(VALID), kept)  # the same zones' periods
    with pytest.raises(RuleChanged, match=r"timezone PRC \(now Asia/Hong_Kong\)"):
        check_kept_meanings(parse_rules(VALID.replace("Asia/Shanghai", "Asia/Hong_Kong")), kept)


def test_kept_meanings_refuse_only_what_changes_a_counter() -> None:
    kept = dict(filter(None, map(counter_meaning, parse_rules(VALID).rules)))
    kept["gone:year"] = '{"timezone":"UTC"}'  # a rule no longer in the file: not looked at
    check_kept_meanings(parse_rules(VALID), kept)
    # limits, matches, descriptions and transaction rules change in place; so does a
    # window, whose periods are named apart from the old window's
    edited = VALID.replace("max_count: 6", "max_count: 2").replace("[atm, kiosk]", "[atm]")
    edited = edited.replace("KWD", "USD").replace("1.5", "1").replace("window: day", "window: week")
    check_kept_meanings(parse_rules(edited), kept)
    # the same meaning written another way (another order, by another version) is the same
    kept["acct-day-cny:day"] = (
        '{"scope":["account_id"],"currency":"CNY","timezone":"Asia/Shanghai"}'
    )
    check_kept_meanings(parse_rules(VALID), kept)
    with pytest.raises(RuleChanged) as refused:
        check_kept_meanings(parse_rules(VALID.replace("[card_id, merchant_id]", "card_id")), kept)
    assert str(refused.value) == (
        "rule 'card.merchant_hour-1': the store keeps its hour counters for scope"
        " [card_id, merchant_id] (now [card_id]). A rule's id names its counters: give a"
        " changed rule a new id, or change it back"
    )
    damaged_ones = [
        ("[1]", "not one limitflow writes"),
        ("{", "not JSON"),
        # a JSON object, but not a meaning: not told as a change of the rule's meaning
        ("{}", "not one limitflow writes"),
        ('{"timezone":"UTC","currency":null,"scope":[]}', "not one limitflow writes"),
        ('{"timezone":1,"currency":null,"scope":["a"]}', "not one limitflow writes"),
        ('{"timezone":"UTC","currency":null,"scope":["a"],"x":1}', "not one limitflow writes"),
    ]
    for damaged, said in damaged_ones:
        kept["acct-day-cny:day"] = damaged
        with pytest.raises(ValueError, match=f"meaning kept for 'acct-day-cny:day' is {said}"):
            check_kept_meanings(parse_rules(VALID), kept)


def test_max_count_has_at_most_15_digits_as_amounts_do() -> None:
    # a verdict shows count_limit and count_remaining: 99999999999999999999 was taken,
    # past the stores' 64-bit integers and the integers JSON readers keep exact
    assert parse_rules(one_rule("window: day\nmax_count: 999999999999999")).rules[0].max_count
    message = refusal(one_rule("window: day\nmax_count: 1000000000000000"))
    assert "max_count" in message and "<= 999999999999999" in message


# --- libyaml's parser reads as PyYAML's own ---------------------------------------------

_TRICKY = [
    VALID,
    (Path(__file__).resolve().parents[2] / "examples" / "rules.yaml").read_text(),
    one_rule(
        "window: day\ncurrency: CNY\nmax_count: 1\nmax_amount: 5000.10\n"
        "match: {country: ['NO', SE], mcc: ['0742', 5411, 6011.0, 0, 6.011e3, 1e3, -2e-0],"
        " atm: [true, False], day: [2026-01-01], t: [2026-01-01T10:00:00Z]}"
    ),
    "rules:\n"
    "  - &base {id: a, window: day, max_count: 1, match: {channel: [atm]}}\n"
    "  - <<: *base\n    id: b\n    window: month\n",
    "\ufeffrules:\n  - {id: bom, window: week, timezone: Asia/Tokyo, max_count: 3}\n",
    '{"rules": [{"id": "json", "window": "hour", "currency": "KWD", "max_amount": 1.234}]}',
    "%YAML 1.1\n---\nrules:\n- id: 'q'\n  window: \"year\"\n  max_count: !!int '7'\n  scope:"
    " [account_id, mcc]\n  match:\n    mcc:\n      - |-\n        5411\n      - >-\n        60\n\n"
    "        11\n",
    *(one_rule(f"window: day\nmax_count: 1\nmatch: {{code: [SE, {v}]}}") for v in ("NO", "0742")),
    one_rule("window: day\nmax_count: 1\nmax_count: 100"),
    "rules:\n  - id: a\n\twindow: day\n",
    "a: &a [1,2]\nb: *c\n",
    "rules: [{id: a, window: day, max_count: 1}]\n---\nrules: []\n",
]


def _reading(text: str) -> str:
    try:
        rules = parse_rules(text)
    except RulesError as exc:
        # a syntax error's wording is the parser's own: where it is, is the same
        line = re.search(r"line (\d+)", str(exc))
        return f"refused at line {line[1]}" if line else "refused"
    return repr(
        [
            (
                *(r.id, r.window, r.scope, r.timezone, r.currency, r.max_count, r.max_amount),
                *((field, sorted(values)) for field, values in r.match),
            )
            for r in rules.rules
        ]
    )


def test_libyaml_s_parser_reads_every_file_as_pyyaml_s_own() -> None:
    # the rules loader is built on libyaml's parser, where PyYAML has it: each of these
    # files gives the same rules, or is refused at the same line, as the pure-Python one
    import json
    import subprocess
    import sys

    import yaml

    from schemas.rules import _RulesLoader

    assert yaml.__with_libyaml__ and issubclass(_RulesLoader, yaml.CSafeLoader)
    script = (
        "import json, sys, yaml\n"
        "del yaml.CSafeLoader\n"
        "from tests.unit.test_rules import _TRICKY, _reading\n"
        "print(json.dumps([_reading(text) for text in _TRICKY]))\n"
    )
    pure = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert json.loads(pure.stdout) == [_reading(text) for text in _TRICKY]


def test_the_rules_keep_nothing_the_yaml_reader_made() -> None:
    """What the rules keep is made after the YAML nodes are freed (``parse_rules``): a
    value kept from among them would hold the heap's pages the nodes took. Before, 5,000
    rules of 200 MCCs kept 458 MiB resident after the file was read; now 94."""
    codes = ", ".join(f'"{n:04d}"' for n in range(200))
    text = "rules:\n" + "".join(
        f"  - {{id: r{n}, window: day, currency: CNY, max_count: 1, timezone: Asia/Shanghai,"
        f" match: {{channel: [pos], mcc: [{codes}, {10**30 + n}, 6011.0, true]}}}}\n"
        for n in range(50)
    )
    yaml_files = str(Path(yaml.__file__).parent)
    parse_rules(text)  # once before, for the caches of the classes it meets
    tracemalloc.start(25)
    gc.disable()  # no collection, so no gc callback (hypothesis has one) runs in it
    try:
        rules = parse_rules(text)
        gc.enable()
        gc.collect()
        kept = tracemalloc.take_snapshot()
    finally:
        gc.enable()
        tracemalloc.stop()
    from_yaml = [
        stat
        for stat in kept.statistics("traceback")
        if any(frame.filename.startswith(yaml_files) for frame in stat.traceback)
    ]
    assert from_yaml == []
    assert len(rules.rules) == 50
    assert dict(rules.rules[49].match) == {
        "channel": frozenset({"pos"}),
        "mcc": frozenset({f"{n:04d}" for n in range(200)} | {str(10**30 + 49), "6011", "true"}),
    }


def test_a_match_number_past_64_digits_is_the_text_of_its_value() -> None:
    rule = parse_rules(one_rule("window: day\nmax_count: 1\nmatch: {mcc: [1e64, 1e-70]}")).rules[0]
    assert dict(rule.match) == {"mcc": frozenset({"1" + "0" * 64, "0." + "0" * 69 + "1"})}


@pytest.mark.parametrize("value", ["1" * 4301, "-" + "9" * 5000, "1e4300", "1.5e99999"])
def test_a_match_number_no_event_can_hold_is_refused_by_name(value: str) -> None:
    # an integer of 4,301 digits was a ValueError from int(), not a refusal; a float that
    # long was kept as "1E+4300", which no event number could equal
    message = refusal(one_rule(f"window: day\nmax_count: 1\nmatch: {{mcc: [5411, {value}]}}"))
    assert message.startswith("rule 'r1': match.mcc: ")
    assert "would be read as a number of more than 4,300 digits" in message
    assert "line 5" in message
    assert len(message) < 300


def test_a_long_float_outside_a_match_is_its_text_as_before() -> None:
    rules = parse_rules(one_rule("window: day\nmax_count: 1\ndescription: 1e5000", "1e5000"))
    assert rules.rules[0].id == "1e5000"


# -- a rules file written as JSON ------------------------------------------------------

_JSON_SCALARS = st.one_of(
    st.sampled_from(
        [
            "5411",
            "0742",
            "NO",
            "day",
            "CNY",
            "USD",
            "JPY",
            "UTC",
            "Asia/Shanghai",
            "a|b",
            "x y",
            "1e3",
            "6011.0",
            "true",
            "null",
            "<<",
            "#x",
            "---",
            "- a",
            "é",
            "\U0001f600",
            "\u2028",
            "\x85",
            "\t",
            "a\\b",
            'a"b',
            "\ufeff",
            "\x7f",
            "",
            "5000.00",
            "*a",
            "&a",
        ]
    ),
    st.text(max_size=4),
    st.integers(-5, 10**16),
    st.sampled_from([0, -0, 10**40, True, False, None, 1.5, 1e3, -2.0, 5000.0]),
)


@st.composite
def _json_rule(draw: st.DrawFn, n: int) -> dict[str, object]:
    """A rule, valid unless a field is drawn from ``_JSON_SCALARS`` (one time in 20)."""

    def field(good: st.SearchStrategy[object]) -> object:
        return draw(_JSON_SCALARS if draw(st.integers(0, 19)) == 0 else good)

    window = field(st.sampled_from(["day", "minute", "week", "lifetime", "transaction"]))
    rule: dict[str, object] = {"id": field(st.just(f"r{n}")), "window": window}
    if draw(st.booleans()):
        rule["scope"] = field(st.sampled_from(["account_id", ["card_id", "mcc"], "card_id"]))
    if draw(st.booleans()):
        rule["timezone"] = field(st.sampled_from(["UTC", "Asia/Shanghai", "Europe/London"]))
    currency = field(st.sampled_from(["CNY", "JPY", "KWD"]))
    if window == "transaction" or draw(st.booleans()):
        rule["currency"] = currency
        rule["max_amount"] = field(st.sampled_from(["5000.00", "7", 5000, 0, "0.5"]))
    if window != "transaction":
        rule["max_count"] = field(st.integers(0, 10**15))
    if draw(st.booleans()):
        value = st.one_of(
            st.sampled_from(["5411", "0742", "NO", "pos", "é", "a|b", "x y"]),
            st.integers(-5, 10**20),
            st.booleans(),
        )
        rule["match"] = field(
            st.dictionaries(
                st.sampled_from(["mcc", "channel", "country"]),
                st.one_of(value, st.lists(value, min_size=1, max_size=4)),
                min_size=1,
                max_size=2,
            )
        )
    if draw(st.integers(0, 9)) == 0:
        rule[draw(st.sampled_from(["description", "extra", "id"]))] = draw(_JSON_SCALARS)
    return rule


@st.composite
def _json_rules_files(draw: st.DrawFn) -> str:
    """JSON rules files, mostly valid, written as a program or a person might."""
    rules = [draw(_json_rule(n)) for n in range(draw(st.integers(0, 4)))]
    doc: object = draw(
        st.sampled_from([{"rules": rules}] * 6 + [{"rules": rules, "x": 1}, rules, {"rules": None}])
    )
    indent = draw(st.sampled_from([None, None, 2, "\t", " "]))
    separators = draw(st.sampled_from([None, (",", ":"), (", ", ": "), (" ,", " : ")]))
    text = json.dumps(doc, indent=indent, separators=separators, ensure_ascii=draw(st.booleans()))
    edit = draw(st.sampled_from([""] * 5 + ["dup", "crlf", "lead", "trail", "tab", "key"]))
    if edit == "dup" and text.startswith('{"rules"'):
        text = '{"rules": [], ' + text[1:]  # the key twice
    elif edit == "crlf":
        text = text.replace("\n", "\r\n")
    elif edit == "lead":
        text = draw(st.sampled_from(["\n", "  ", "\t", "\ufeff", " \n "])) + text
    elif edit == "trail":
        text += draw(st.sampled_from(["\n", "\t", " \n\t", "# note", "\n---\n"]))
    elif edit == "tab":
        text = text.replace("\n", "\n\t")
    elif edit == "key":
        text = text.replace('":', '"\n:', 1)
    return text


def _outcome(text: str | bytes) -> str:
    try:
        return repr(parse_rules(text))
    except RulesError as exc:
        return f"refused: {exc}"


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_json_rules_files())
def test_a_json_file_read_as_json_means_what_it_means_as_yaml(text: str) -> None:
    """JSON that YAML reads the same is read as JSON (fast); anything else as YAML: the
    rules, or the refusal word for word, are those YAML gives."""
    fast = [_outcome(text), _outcome(text.encode())]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rules_module, "_plain_json", lambda _: None)
        assert fast == [_outcome(text), _outcome(text.encode())]


def test_a_json_file_is_read_as_json_and_yaml_is_not() -> None:
    """The example rules as JSON (pretty, compact, with tabs, as bytes) take the JSON
    path; YAML, and JSON that YAML reads otherwise, do not."""
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples/rules.yaml").read_text())
    for text in (
        json.dumps(data, indent=2),
        json.dumps(data, separators=(",", ":")),
        json.dumps(data, indent="\t") + "\n",
        json.dumps(data, ensure_ascii=False).encode(),
    ):
        assert rules_module._plain_json(text) == data
        assert parse_rules(text).rules == parse_rules(yaml.safe_dump(data)).rules
    for text in (
        yaml.safe_dump(data),  # YAML
        json.dumps({"rules": [{"id": "a", "max_count": 1e3}]}),  # the text "1e3" in YAML
        json.dumps({"rules": [{"id": "a\u2028b"}]}, ensure_ascii=False),  # a line break
        json.dumps({"rules": [{"id": "a\\b"}]}),  # an escape
        '{"rules": [], "rules": []}',  # refused by YAML, saying where
        '\t{"rules": []}',  # refused by YAML
        '{"rules"\n: []}',  # refused by YAML
        json.dumps({"k" * 300: 1}),  # a long key: YAML refuses one past 1,024
        '{"rules": [{"id": "r", "max_count": ' + "9" * 4301 + "}]}",  # no int() reads it
    ):
        assert rules_module._plain_json(text) is None


def test_a_json_file_with_characters_past_u_ffff_escaped_is_read() -> None:
    # json.dumps escapes them as surrogate pairs, which YAML refuses: such a generated
    # file (a merchant's emoji, a CJK Extension B name) was refused as "not valid YAML"
    merchants = ["\U00020000\u5e97", "\\ud83d\\ude00", "\\\U0001f600"]
    rule = {"id": "r", "window": "day", "max_count": 1, "description": "pay \U0001f600"}
    data = {"rules": [{**rule, "match": {"merchant": merchants}}]}
    text = json.dumps(data)
    assert "\\ud83d\\ude00" in text
    for written in (text, text.encode(), ("\ufeff" + text).encode(), text.replace("1,", "1.0,")):
        assert parse_rules(written).rules[0].match == (("merchant", frozenset(merchants)),)
    # a lone surrogate is no character: refused as before, and so is YAML's escape of one
    assert "not valid YAML" in refusal(text.replace("pay \\ud83d\\ude00", "pay \\ud83d"))
    assert "not valid YAML" in refusal(
        one_rule('window: day\nmax_count: 1\ndescription: "\\ud83d\\ude00"')
    )


# -- a YAML file read rule by rule ------------------------------------------------------


@st.composite
def _yaml_rules_files(draw: st.DrawFn) -> str:
    """YAML rules files without an alias, mostly valid, in block and flow styles, some
    with a mistake: a key twice, a value YAML 1.1 reads otherwise, a tab, a float, a
    second document, a syntax error, an anchor, a tag, a rules list not at the top."""
    rules = [draw(_json_rule(n)) for n in range(draw(st.integers(0, 4)))]
    doc: object = draw(
        st.sampled_from(
            [{"rules": rules}] * 6
            + [
                {"x": [1, {"y": 2}], "rules": rules},
                {"rules": rules, "x": 1},
                rules,
                {"rules": None},
            ]
        )
    )
    style = draw(st.sampled_from([False, None, True]))
    text = yaml.safe_dump(doc, default_flow_style=style, allow_unicode=draw(st.booleans()))
    text = text.replace("'", "") if draw(st.integers(0, 4)) == 0 else text  # plain scalars
    lines = text.splitlines(keepends=True)
    at = draw(st.integers(0, len(lines)))
    edit = draw(
        st.sampled_from(
            ["", "", "", "line", "line", "dup", "rules", "tab", "second", "anchor", "tag"]
        )
    )
    if edit == "line":
        lines.insert(
            at,
            draw(
                st.sampled_from(
                    [
                        "    max_count: 1\n",
                        "  - {id: z, window: day, max_count: NO}\n",
                        "  - {id: z, window: day, max_count: 1, match: {mcc: [0742, 6011.0]}}\n",
                        "  - {id: z, window: day, max_count: 1, max_count: 2}\n",
                        "  - {id: z, window: day, max_count: 1.0, match: {mcc: [1e5000]}}\n",
                        "  - [a, : b\n",
                        "  ]\n",
                        "# a comment\n",
                        "\t\n",
                        "  - !!str 5\n",
                        "  - &a {id: y, window: day, max_count: 3}\n",
                    ]
                )
            ),
        )
    elif edit == "dup" and lines:
        lines.insert(at, lines[at - 1] if at else lines[0])
    elif edit == "rules":
        lines.append("rules: []\n")
    elif edit == "tab":
        lines = [line.replace("  ", "\t", 1) for line in lines]
    elif edit == "second":
        lines.append("---\nrules: []\n")
    elif edit == "anchor":
        lines = [lines[0].replace("rules:", "rules: &r", 1), *lines[1:]]
    elif edit == "tag":
        lines = [lines[0].replace("rules:", "rules: !!seq", 1), *lines[1:]]
    return "".join(lines)


@contextlib.contextmanager
def _reading_whole() -> Iterator[None]:
    """Every YAML file read whole, as before rules were made one by one."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            rules_module._StreamingRulesLoader, "read", rules_module._RulesLoader.get_single_data
        )
        yield


_TWICE_IN_A_RULE: Final = "rules:\n  - {id: a, window: day, max_count: 1, max_count: 2}\n"


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_yaml_rules_files())
# two mistakes: the one told is the one told before
@example(text=_TWICE_IN_A_RULE + "  - [a, : b\n")  # a syntax error after
@example(text=_TWICE_IN_A_RULE + "rules: []\n")  # the rules twice
@example(text=_TWICE_IN_A_RULE + "  - {id: b, window: day, max_count: 1, id: c}\n")
@example(text="x: {a: 1, a: 2}\n" + _TWICE_IN_A_RULE)  # a key twice before the rules
@example(text="rules:\n  - {id: &a a, window: &a day, max_count: 1}\n")  # an anchor twice
# (helper-53's fuzzer) a mistake nested deeper in an earlier rule than one in a later
@example(text="rules:\n- {!o }\n- !y")
@example(text="rules:\n- {a: {b: 1, b: 2}}\n- {c: 1, c: 2}\n")
@example(text="rules:\n- {id: !foo x}\nz: {b: !bar y}\n")
@example(text="rules:\n- {a: [!!int x]}\n- {id: r, id: r}\n")
def test_a_yaml_file_read_rule_by_rule_means_what_it_means_read_whole(text: str) -> None:
    """A file without an alias has each rule made as soon as it is read (a fraction of
    the peak memory): the rules, or the refusal word for word, are those of reading the
    file whole (a file refused so is read again whole, for the refusal it had)."""
    assume("*" not in text)  # (a value drawn as "*a", its quotes taken off)
    streamed = [_outcome(text), _outcome(text.encode())]
    with _reading_whole():
        whole = [_outcome(text), _outcome(text.encode())]
    assert streamed == whole


def test_a_yaml_file_without_an_alias_never_holds_every_rule_s_nodes() -> None:
    """Each rule's nodes are freed before the next rule is read: the most Python holds
    while reading 100 rules of 200 MCCs is a fraction of what reading the file whole
    held (tracemalloc counts allocations, not time: the same figures each run)."""
    codes = ", ".join(f'"{n:04d}"' for n in range(200))
    text = "rules:\n" + "".join(
        f"  - {{id: r{n}, window: day, currency: CNY, max_count: 1, match: {{mcc: [{codes}]}}}}\n"
        for n in range(100)
    )

    def peak() -> int:
        tracemalloc.start()
        try:
            parse_rules(text)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    rule_by_rule = peak()
    with _reading_whole():
        whole = peak()
    assert rule_by_rule < whole / 2, (rule_by_rule, whole)


@pytest.mark.parametrize("written_as", ["yaml", "json"])
def test_a_text_repeated_across_rules_is_held_once_while_the_file_is_read(
    written_as: str,
) -> None:
    """An issuer's file lists the same MCCs in rule after rule: each is held once while
    the file is read (5,000 rules of 200 MCCs: 94 MiB at the peak, not 157-159), so a
    worker's start needs little more memory than it keeps."""
    codes = [str(n) for n in range(5000, 5050)]
    doc = {
        "rules": [
            {"id": f"r{n}", "window": "day", "max_count": 1, "match": {"mcc": [*codes, 5411]}}
            for n in range(3)
        ]
    }
    text = yaml.safe_dump(doc) if written_as == "yaml" else json.dumps(doc)
    data = (
        rules_module._plain_json(text) if written_as == "json" else rules_module._read_yaml(text)[0]
    )
    assert data == doc  # the same values, 5411 still a number
    lists = [rule["match"]["mcc"] for rule in data["rules"]]
    assert all(a is b for a, b in zip(lists[0][:-1], lists[2][:-1], strict=True))
    assert lists[0] is not lists[2]


# -- what an explicit tag cannot read ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (one_rule("window: day\nmax_count: !!int c"), "'c' cannot be read as !!int (line 4,"),
        (one_rule("window: day\nmax_count: !!int"), "'' cannot be read as !!int (line 4,"),
        (one_rule("window: day\nmax_count: !!bool x"), "'x' cannot be read as !!bool (line 4,"),
        (one_rule("window: !!bool [day]\nmax_count: 1"), "a list cannot be read as !!bool"),
        (one_rule("window: day\nmax_count: 1\nmatch: {mcc: [!!bool x]}"), "!!bool (line 5,"),
        (one_rule("window: day\nmax_count: 1\nmatch: {mcc: [!!map x]}"), "expected a mapping"),
        (one_rule("window: !!map [a]\nmax_count: 1"), "expected a mapping node, but found seq"),
        (one_rule("window: !!binary xyz\nmax_count: 1"), "failed to decode base64 data"),
        ("rules:\n- !!map", "expected a mapping node, but found scalar (line 2, column 3)"),
        ("rules: [{a: {b: !!int }}, {!!int y: 1}]", "'y' cannot be read as !!int (line 1,"),
        ("!!bool []\n", "a list cannot be read as !!bool (line 1, column 1)"),
        ("rules: !!set [a]\n", "expected a mapping node, but found sequence"),
        ("rules:\n- {!!set {}: 1}\n", "found unhashable key (line 2, column 4)"),
        ("x: &a 1\ny: *a\nrules: " + "[" * 600 + "]" * 600, "nested too deeply to be read"),
    ],
)
def test_a_value_its_explicit_tag_cannot_read_is_refused_in_one_line(text: str, said: str) -> None:
    # was a traceback from PyYAML's constructors (ValueError, KeyError, AttributeError…),
    # at every start of `run` and `replay`, and from `rules check`; and a list item
    # tagged !!map was read as a Python generator
    message = refusal(text)
    assert said in message and "\n" not in message


def test_a_refusal_naming_a_key_written_over_two_lines_is_one_line() -> None:
    # the key as written went into the message: the CLI's one-line reason was two lines
    assert refusal(one_rule('window: day\nmax_count: 1\n"x\\ny": 1')) == (
        "rule 'r1' (rules[0]): Object contains unknown field `x\\ny` - at `$.rules[0]`"
    )
    assert refusal(one_rule('window: day\nmax_count: 1\nmatch: {"m\\ncc": [0742]}')) == (
        "rule 'r1': match.m\\ncc: 0742 would be read as 482: write \"0742\" for the text,"
        " or 482 (line 5)"
    )


def test_a_list_nested_deeper_than_python_s_composer_goes_is_read_as_before() -> None:
    # rule by rule, PyYAML's composer recurses in Python; past ~480 levels it cannot, and
    # the file is read whole as before: the same refusal, not a crash
    text = "rules: " + "[" * 900 + "]" * 900 + "\n"
    assert refusal(text) == "rules[0]: Expected `object`, got `array` - at `$.rules[0]`"


_YAML_TOKENS = st.sampled_from(
    [
        *("rules", "id", "window", "day", "max_count", "match", "mcc", "currency", "CNY"),
        *("1", "0742", "5000.00", "1e3", "NO", "~", "''", '"x"', "'a b'", "2026-01-01"),
        *("!!int", "!!bool", "!!float", "!!str", "!!null", "!!map", "!!seq", "!!set"),
        *("!!omap", "!!pairs", "!!binary", "!!timestamp", "!foo", "!", "&a", "*a", "<<"),
        *("!!set {}", "!!set {a}", "? !!set {b}"),
        *(": ", ":", "- ", "? ", "[", "]", "{", "}", ", ", "#c", "---", "...", "%YAML 1.1"),
        *("\n", "\n  ", "\n    ", "\n- ", "\t", " ", "\ufeff"),
    ]
)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    head=st.sampled_from(["", "rules:\n  - ", "rules: [", "rules:\n  - {id: a, window: day, "]),
    tokens=st.lists(_YAML_TOKENS, max_size=30),
)
def test_any_text_is_read_or_refused_never_a_crash(head: str, tokens: list[str]) -> None:
    """Whatever a rules file holds, reading it gives rules or one ``RulesError``: never
    another exception (helper-53's fuzzer found 10 kinds of crash, all in the constructors
    of explicit tags, in both ways of reading a file)."""
    text = head + "".join(tokens)
    for form in (text, text.encode()):
        try:
            parse_rules(form)
        except RulesError as exc:
            assert "\n" not in str(exc)


def test_a_match_on_amount_is_by_value_and_refuses_what_is_no_number() -> None:
    # an event's amount is taken by its value ("100.00" is 100), so a rule's must be too:
    # "100.00" in a match would have matched no amount at all
    rules = parse_rules(
        'rules:\n  - {id: r, window: day, max_count: 1, match: {amount: ["100.00", 2.50, 7]}}\n'
    )
    assert rules.rules[0].match == (("amount", frozenset({"100", "2.5", "7"})),)
    with pytest.raises(RulesError, match=r"rule 'r': match: amount: 'abc' is not a decimal"):
        parse_rules("rules:\n  - {id: r, window: day, max_count: 1, match: {amount: [abc]}}\n")
    # another field keeps its text: "0742" is not 742
    other = parse_rules('rules:\n  - {id: r, window: day, max_count: 1, match: {mcc: ["0742"]}}\n')
    assert other.rules[0].match == (("mcc", frozenset({"0742"})),)
