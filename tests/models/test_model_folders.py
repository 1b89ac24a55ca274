"""A model folder's mistakes named where they are read: a cut or badly typed config.json (the
file and the key), a Hub name or URL given for a folder (how to download it), a folder without
a tokenizer (issue 61, "Why" 8 and 9)."""

from __future__ import annotations

import json

import pytest

from fitjax.data import TextLoader
from fitjax.models import CausalLMModule, from_config, from_pretrained

CONFIG = {"model_type": "llama", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2}


def _config_file(tmp_path, text: str):
    (tmp_path / "config.json").write_text(text)
    return tmp_path


def test_a_truncated_config_json_names_the_file(tmp_path):
    folder = _config_file(tmp_path, json.dumps(CONFIG)[:40])
    with pytest.raises(ValueError, match=rf"'{folder / 'config.json'}' is not valid JSON .*line 1 column"):
        from_pretrained(folder)


@pytest.mark.parametrize("key, value, says", [
    ("hidden_size", "32", r"hidden_size='32' \(str\); it must be an int of at least 1; write 32 without quotes"),
    ("vocab_size", 0, r"vocab_size=0 \(int\); it must be an int of at least 1"),
    ("num_hidden_layers", -1, r"num_hidden_layers=-1 \(int\)"),
    ("num_key_value_heads", 3, r"num_key_value_heads=3, which does not divide num_attention_heads=2"),
    ("rms_norm_eps", "1e-6", r"rms_norm_eps='1e-6' \(str\); it must be a number above 0"),
])
def test_a_bad_config_value_names_the_file_and_the_key_when_read(tmp_path, key, value, says):
    folder = _config_file(tmp_path, json.dumps({**CONFIG, key: value}))
    with pytest.raises(ValueError, match=rf"'{folder / 'config.json'}' has {says}"):
        from_pretrained(folder)
    with pytest.raises(ValueError, match=rf"the config has {says}"):  # a dict, as CausalLMModule takes it
        CausalLMModule({**CONFIG, key: value})


def test_a_family_default_of_kv_heads_that_does_not_divide_the_heads_is_named():
    mistral = {**CONFIG, "model_type": "mistral", "num_attention_heads": 4}  # mistral's default: 8 kv heads
    with pytest.raises(ValueError, match=r"num_attention_heads=4 and no num_key_value_heads; mistral's default, 8"):
        from_config(mistral)


@pytest.mark.parametrize("given, name", [
    ("meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B"),
    ("https://huggingface.co/meta-llama/Llama-3.2-1B", "meta-llama/Llama-3.2-1B"),
    ("s3://bucket/models/llama", "NAME"),
])
def test_a_hub_name_or_url_says_fitjax_reads_local_folders_and_how_to_download(given, name):
    with pytest.raises(ValueError) as error:
        from_pretrained(given)
    message = str(error.value)
    assert f"folder={given!r}" in message and "reads model folders on local disk" in message, message
    assert f"huggingface-cli download {name} --local-dir" in message, message
    assert ":/" not in message.replace("://", "")  # no mangled `s3:/...` path


def test_a_folder_without_tokenizer_files_gets_fitjaxs_message(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"text": "a b"}\n')
    (tmp_path / "model").mkdir()
    model = _config_file(tmp_path / "model", json.dumps(CONFIG))  # a model folder, its tokenizer left behind
    with pytest.raises(FileNotFoundError, match=r"holds no tokenizer: none of \['tokenizer.json'.*holds \['config.json'\]"):
        TextLoader(tmp_path / "data.jsonl", tokenizer=model, seq_len=8, batch_size=2)
