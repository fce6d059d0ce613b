"""fedclust bench-rounds: runs each algorithm and splits its round times by stage."""



from fedclust.bench import rounds as bench_rounds

TINY = ["data.name=synthetic", "data.synthetic_dim=1", "data.train_size=30", "data.test_size=10", "clients=6",
        "algorithm.k=2", "algorithm.l=3", "seed=1"]


def test_table_ratios_by_hand():
    text = bench_rounds.table({"random": {"stage1": [1.0, 3.0], "stage2": [2.0]},
                               "panm_loss": {"stage1": [4.0], "stage2": [5.0, 7.0, 9.0]}})
    rows = text.splitlines()[2:]
    assert rows[0] == "| random | 2.000 | 1.00 | 2.000 | 1.00 |"
    assert rows[1] == "| panm_loss | 4.000 | 2.00 | 7.000 | 3.50 |"


