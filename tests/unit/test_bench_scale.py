"""fedclust bench-scale: round time, gather bytes and peak memory per client count,
on one process and under torchrun with two."""

from pathlib import Path

from fedclust.bench import scale as bench_scale
from fedclust.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DIM = 5
P = DIM * 10 + 10          # logistic regression on Synthetic(dim 5): weights 5 x 10 + 10 biases
TINY = ["--config", "", "data.name=synthetic", f"data.synthetic_dim={DIM}", "data.train_size=30", "data.test_size=10",
        "algorithm.k=2", "seed=1"]


def test_law_by_hand():
    """The growth law's terms: the MLP (P = 784·200+200 + 200·200+200 + 200·10+10), its data per client,
    and an algorithm that also gathers the models before training (the config's PANMGrad: 2P + 2 columns)."""
    cfg = load_config("configs/fmnist_rotation2.yaml", ["clients=1000", "data.share_images=true",
                                                        "algorithm.name=random"])
    mlp = 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    lw = bench_scale.law(cfg, 2, base=100)
    assert lw["params"] == mlp and lw["columns"] == mlp + 2
    assert lw["gather_bytes"] == 1000 * (mlp + 2) * 4
    d = (200 + 100) * (784 * 1 + 8)   # Fashion-MNIST images kept as uint8 (1 byte a pixel), labels int64
    assert lw["data_bytes_per_client"] == d
    # Random chooses by index lists: no [C, n] masks
    assert lw["memory_bytes"] == 100 + 500 * d + 2 * 500 * mlp * 4 + 2 * 1000 * (mlp + 2) * 4
    assert bench_scale.law(cfg, 1)["gather_bytes"] == 0
    panm = load_config("configs/fmnist_rotation2.yaml", ["clients=1000", "data.share_images=true"])
    assert bench_scale.law(panm, 2)["columns"] == 2 * mlp + 2
    # ... whose copy from before training is dropped before the gossip makes the new models: two [C, P] at most
    # (plus its similarity's pieces: update, distance from w0 and their squares, [n, 16,384] float32 each)
    # (PANM chooses by bool [C, n] masks, 8 bytes an entry)
    assert bench_scale.law(panm, 1)["memory_bytes"] == (1000 * d + 2 * 1000 * mlp * 4 + 1000 * 1000 * 8
                                                        + 4 * 1000 * 16384 * 4)


def test_law_with_the_exchange_in_column_blocks():
    """exchange_mb: one block held (columns x the bytes of a column, within the budget); PANMGrad gathers
    after + before for its similarity and after again for the gossip (3P + 2 columns)."""
    mlp = 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    d = (200 + 100) * (784 * 1 + 8)
    panm = load_config("configs/fmnist_rotation2.yaml", ["clients=1000", "data.share_images=true", "exchange_mb=64"])
    lw = bench_scale.law(panm, 2)
    columns = 64 * 2**20 // (2 * 2 * 500 * 2 * 4)      # received shards of 500 rows, 2 parts, and their copies
    assert lw["columns"] == 3 * mlp + 2 and lw["gather_bytes"] == 1000 * (3 * mlp + 2) * 4
    assert lw["exchange_bytes"] == columns * 2 * 2 * 500 * 2 * 4 <= 64 * 2**20
    assert lw["memory_bytes"] == (500 * d + 2 * 500 * mlp * 4 + 500 * 1000 * 8 + lw["exchange_bytes"]
                                  + 4 * 1000 * 4194 * 4)      # pieces no wider than a block
    assert columns == 4194
    rnd = load_config("configs/fmnist_rotation2.yaml", ["clients=1000", "data.share_images=true", "exchange_mb=64",
                                                        "algorithm.name=random"])
    assert bench_scale.law(rnd, 2)["gather_bytes"] == 1000 * (mlp + 2) * 4


def test_law_counts_dfca_bank_twice():
    """DFCA keeps k models a client ([C, k, P]) and makes a new bank each round: 2·C·k·P·4 bytes more than
    Random's law; its labels ride the gather as one more column."""
    mlp = 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    base = ["clients=1000", "data.share_images=true"]
    rnd = bench_scale.law(load_config("configs/fmnist_rotation2.yaml", base + ["algorithm.name=random"]), 2)
    dfca = bench_scale.law(load_config("configs/fmnist_rotation2.yaml",
                                       base + ["algorithm.name=dfca", "dfca.clusters=4"]), 2)
    assert dfca["bank_bytes"] == 2 * 500 * 4 * mlp * 4 and rnd["bank_bytes"] == 0
    assert dfca["gather_bytes"] == 1000 * (mlp + 3) * 4
    assert dfca["memory_bytes"] == rnd["memory_bytes"] + dfca["bank_bytes"] + 2 * 2 * 500 * 4   # + the label column


def test_law_counts_dac_tables_on_every_process():
    """DAC keeps [n, n] float32 scores and bool pulls on every process, and makes new ones each round."""
    base = ["clients=1000", "data.share_images=true"]
    rnd = bench_scale.law(load_config("configs/fmnist_rotation2.yaml", base + ["algorithm.name=random"]), 2)
    dac = bench_scale.law(load_config("configs/fmnist_rotation2.yaml", base + ["algorithm.name=dac"]), 2)
    assert dac["bank_bytes"] == 2 * 1000 * 1000 * 5
    assert dac["memory_bytes"] == rnd["memory_bytes"] + dac["bank_bytes"]


def test_predict_runs_nothing(capsys):
    assert bench_scale.main(["--predict", "--processes", "2", "--clients", "10,100", *TINY]) == 0
    out = capsys.readouterr().out
    assert "2 process(es)" in out and f"| 100 | {100 * (P + 2) * 4 / 2**20:.1f} |" in out


def test_a_two_stage_algorithm_stays_in_stage_one_unless_told():
    """The timed rounds (and the one after) are stage one, so no round of the bench ends it; an override wins."""
    assert bench_scale._cfg("configs/fmnist_rotation2.yaml", 100, 2, "panm_grad", []).stage1_rounds == 3
    assert bench_scale._cfg("configs/fmnist_rotation2.yaml", 100, 2, "panm_grad", ["stage1_rounds=2"]).stage1_rounds == 2
    assert bench_scale._cfg("configs/fmnist_rotation2.yaml", 100, 2, "random", []).stage1_rounds == 100
