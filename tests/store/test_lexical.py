"""Query terms for the trigram index and the weighted fusion (``nemori_dspy.store.lexical``)."""

from __future__ import annotations

import numpy as np

from nemori_dspy.store.lexical import lexical_query, lexical_text, weighted_fusion


def test_a_chinese_run_becomes_its_trigrams():
    q = lexical_query("卡罗琳去哪了？")
    assert q.long == ["卡罗琳", "罗琳去", "琳去哪", "去哪了"] and q.short == []
    assert q.fts_match() == '"卡罗琳" OR "罗琳去" OR "琳去哪" OR "去哪了"'


def test_english_content_words_of_four_or_more_letters_are_kept_lowercased_once():
    q = lexical_query("What did Caroline research? Caroline, of 5 cats")
    assert q.long == ["caroline", "research", "cats"] and not q.short


def test_short_cjk_runs_are_short_terms_and_mixed_scripts_split():
    q = lexical_query("小组 LGBTQ支持 组")
    assert q.short == ["小组", "支持", "组"] and q.long == ["lgbtq"]
    assert not lexical_query("a ? 1") and lexical_query("a ? 1").fts_match() is None


def test_lexical_text_joins_the_non_empty_parts():
    assert lexical_text("cue", "", "msg") == "cue\nmsg"


def test_weighted_fusion_adds_the_best_lexical_match_at_full_weight():
    cos = np.array([0.9, 0.7, 0.1])
    fused = weighted_fusion(cos, (np.array([1, 2]), np.array([4.0, 1.0])), 0.3)
    assert np.allclose(fused, [0.63, 0.49 + 0.3, 0.07 + 0.075])
    assert np.allclose(weighted_fusion(cos, (np.array([1]), np.array([4.0])), 0.0), cos)
    assert np.allclose(weighted_fusion(cos, (np.array([], dtype=int), np.array([])), 0.3), 0.7 * cos)
