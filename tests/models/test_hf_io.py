"""Hugging Face and GGUF files through rljax.io: a model directory on gs:// (GCS emulator)."""

import jax
import numpy as np
import pytest
from flax import nnx

from rljax import io
from rljax.models import gguf, hf
from rljax.models.sharding import LEARNER_RULES, make_mesh
from rljax.models.tokenizer import Tokenizer
from rljax.models.transformer import init_sharded
from rljax.testing import TINY_MODEL
from rljax.testing.filesystems import gcs_workdir


@pytest.mark.parametrize("max_shard_bytes", [4 << 30, 200_000])  # one file, and an index
def test_save_and_load_hf_directory_on_gcs(tmp_path, max_shard_bytes):
    mesh = make_mesh(jax.devices(), {"fsdp": 4, "tensor": 2})
    _, params = init_sharded(TINY_MODEL, mesh, LEARNER_RULES, 0)
    want = jax.device_get(nnx.to_pure_dict(params))
    tok = Tokenizer.char_level()
    with gcs_workdir() as workdir:
        remote = f"{workdir}/hf"
        hf.save_hf(remote, TINY_MODEL, params, tokenizer=tok, max_shard_bytes=max_shard_bytes)
        names = io.listdir(remote)
        assert (hf.INDEX_FILE in names) == (max_shard_bytes < 4 << 30)
        cfg, _, loaded = hf.load_hf(remote, mesh=mesh, rules=LEARNER_RULES)
        assert cfg == TINY_MODEL
        for name, array in nnx.to_pure_dict(loaded).items():
            np.testing.assert_array_equal(np.asarray(array), want[name], err_msg=name)
        assert Tokenizer.from_dir(remote).encode("12+3=") == tok.encode("12+3=")
        assert hf.read_config(remote)["eos_token_id"] == tok.eos_id
        with pytest.raises(FileNotFoundError, match="gs://.*/nothing has neither"):
            hf.SafetensorsReader(f"{workdir}/nothing")


def test_gguf_on_gcs_names_the_remote_file():
    pytest.importorskip("gguf")
    mesh = make_mesh(jax.devices()[:1], {"fsdp": 1})
    with gcs_workdir() as workdir:
        with pytest.raises(FileNotFoundError, match=r"GGUF file gs://.*/m\.gguf does not exist"):
            gguf.load_gguf(f"{workdir}/m.gguf", mesh=mesh, rules=LEARNER_RULES)
        io.write_bytes(f"{workdir}/junk.gguf", b"not a gguf file")
        with pytest.raises(ValueError, match=r"GGUF file gs://.*/junk\.gguf could not be read"):
            gguf.read_gguf_config(f"{workdir}/junk.gguf")
