"""Data-path benchmarks: synthetic city generation and preprocessing (pytest benchmarks/ --benchmark-only)."""
from stfast.data.preprocess import preprocess
from stfast.data.synthetic import generate_city


def test_generate_city_20k(benchmark):
    tr = benchmark.pedantic(generate_city, args=(20_000,), kwargs={"seed": 0}, rounds=3)
    assert len(tr) == 20_000


def test_preprocess_20k(benchmark):
    raw = generate_city(20_000, seed=0)
    trips = benchmark.pedantic(preprocess, args=(raw,), rounds=3)
    assert len(trips) > 19_000
