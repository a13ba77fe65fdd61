"""KV page reservation on the host: batched reservations equal one-by-one ones, errors keep the table consistent."""

import pytest
import torch

from eaglet.models.kv_cache import KVCache, KVPoolExhausted


def _cache(num_pages=40):
    kv = KVCache(1, 1, 4, max_reqs=3, max_context=64, page_size=4, num_pages=num_pages)
    return kv, [kv.alloc_request() for _ in range(3)]


def _table_matches_host(kv):
    for r, pages in kv._pages.items():
        assert kv.req_to_page[r, : len(pages)].tolist() == pages and not kv.req_to_page[r, len(pages):].any()


def test_reserve_many_equals_one_by_one():
    steps = [[(0, 5), (1, 9), (2, 1)], [(0, 5), (1, 13), (2, 17)], [(0, 30), (1, 13), (2, 18)]]
    one, rows = _cache()
    many, _ = _cache()
    for wants in steps:
        for r, n in wants:
            one.reserve(rows[r], n)
        many.reserve_many([(rows[r], n) for r, n in wants])
        assert torch.equal(one.req_to_page, many.req_to_page) and one._pages == many._pages
    _table_matches_host(many)


def test_pages_handed_out_before_an_error_reach_the_table():
    kv, rows = _cache(num_pages=8)  # 7 usable pages
    with pytest.raises(KVPoolExhausted, match="kv.num_pages"):
        kv.reserve_many([(rows[0], 8), (rows[1], 12), (rows[2], 20)])  # 2 + 3 pages, then 5 > 2 left
    assert [len(kv._pages[r]) for r in rows] == [2, 3, 0]
    _table_matches_host(kv)
    with pytest.raises(ValueError, match="context is 64"):
        kv.reserve_many([(rows[2], 4), (rows[0], 65)])
    assert len(kv._pages[rows[2]]) == 1
    _table_matches_host(kv)
