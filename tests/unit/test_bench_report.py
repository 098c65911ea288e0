"""The benchmark's table and JSON: the ratio of each round next to the medians' ratio."""

from __future__ import annotations

from bench.report import Row, Scenario, Target, table


def _row(peer_label: str, peer_rounds: list[float], ours_rounds: list[float]) -> Row:
    return Row("SEND 1 msg/tx, 1 producer", "msg/s", peer_label, 1_000.0, 1_000.0,
               target=Target("ratio_at_least", 1.0, ">= 1.0x"),
               peer_rounds=peer_rounds, ours_rounds=ours_rounds)


def _line(row: Row) -> list[str]:
    rendered = table([Scenario("a", "SEND", rows=[row])]).splitlines()
    header = [cell.strip() for cell in rendered[0].strip("|").split("|")]
    cells = [cell.strip() for cell in rendered[2].strip("|").split("|")]
    return [cells[header.index("Ours/peer")], cells[header.index("Per round")]]


def test_each_round_pairs_ours_with_the_peer_measured_in_it() -> None:
    row = _row("pgmq.send", [1_000.0, 500.0, 800.0], [900.0, 600.0, 800.0])

    assert row.round_ratios == [0.9, 1.2, 1.0]
    assert row.as_json()["ours_over_peer_rounds"] == [0.9, 1.2, 1.0]
    # The medians' ratio passes; the rounds show it did not in every one.
    assert _line(row) == ["1.00x", "0.90-1.20x"]


def test_a_share_of_the_bare_insert_shows_its_rounds_as_percentages() -> None:
    row = _row("bare INSERT", [1_000.0, 2_000.0], [610.0, 1_000.0])

    assert _line(row) == ["100%", "50-61%"]


def test_rounds_that_do_not_pair_up_show_no_range() -> None:
    row = _row("pgmq.send", [1_000.0, 900.0], [950.0])

    assert row.round_ratios == []
    assert _line(row) == ["1.00x", ""]
