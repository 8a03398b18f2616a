"""Settings panel: retrieval and decoding parameters (the model's defaults preselected)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import gradio as gr

from app.choices import CACHED_KV_MODES, DECODERS
from app.defaults import FIELD_HELP, ModelDefaults
from app.service import DocQA


@dataclass
class SettingsInputs:
    top_k: gr.Number
    chunk_size: gr.Number
    token_budget: gr.Number
    gen_length: gr.Number
    threshold: gr.Slider
    kv_mode: gr.Dropdown
    decoder: gr.Dropdown
    score_margin: gr.Number
    coverage_gain: gr.Number

    def components(self) -> list:
        return [self.top_k, self.chunk_size, self.token_budget, self.gen_length, self.threshold, self.kv_mode,
                self.decoder, self.score_margin, self.coverage_gain]


def build(service: DocQA) -> SettingsInputs:
    d = service.defaults
    gr.Markdown("These settings apply to the next question asked in the Chat tab. They start at the model's "
                "defaults (its `docqa.json`), listed below with what each does.")
    with gr.Row():
        top_k = gr.Number(value=d.top_k, precision=0, minimum=0, label="K chunks (0 = automatic)",
                          info="How many chunks the answer is read from.")
        chunk_size = gr.Number(value=d.chunk_size, precision=0, minimum=16,
                               label="Chunk size C (a change re-encodes the documents)",
                               info="Tokens per chunk; each chunk is encoded once, alone.")
        token_budget = gr.Number(value=d.token_budget, precision=0, minimum=0, label="B tokens per chunk (0 = all)",
                                 info="Tokens of each chosen chunk kept per layer and head, the most attended.")
        score_margin = gr.Number(value=d.score_margin or 0, minimum=0, step=0.1,
                                 label="Keep chunks scoring within this of the best (0 = no margin rule)",
                                 info="In nats: a larger margin keeps more of the K chunks.")
        coverage_gain = gr.Number(value=d.coverage_gain or 0, minimum=0, step=0.05,
                                  label="Also keep chunks that explain more of the question, by this much a "
                                        "token (0 = off; both 0 keep all K)",
                                  info="In nats a question token.")
    with gr.Row():
        gen_length = gr.Number(value=d.gen_length, precision=0, minimum=32, step=32,
                               label="Answer length (tokens, a multiple of 32)",
                               info="The canvas that is denoised; the answer stops at its end token.")
        # A fine step: a coarse one would snap the model's default (0.999 for the bundled model) to 1.
        threshold = gr.Slider(0.05, 1.0, value=d.threshold, step=0.001, label="Confidence threshold",
                              info="A slot is committed once the model is this sure of it (higher: more steps).")
        kv_mode = gr.Dropdown(choices=list(CACHED_KV_MODES), value=d.kv_mode, label="KV mode",
                              info="static: decode over the stored chunk KV; joint: re-encode the chosen chunks "
                                   "with the question first (slower).")
        decoder = gr.Dropdown(choices=list(DECODERS), value=d.decoder, label="Decoder",
                              info="The rule choosing which slots to commit at each denoising step.")
    gr.Markdown(defaults_table(service), elem_id="model-defaults")
    return SettingsInputs(top_k, chunk_size, token_budget, gen_length, threshold, kv_mode, decoder, score_margin,
                          coverage_gain)


def defaults_table(service: DocQA) -> str:
    """The model's defaults as a Markdown table: setting, value, what it does."""
    d = service.defaults
    rows = []
    for f in fields(ModelDefaults):
        value = getattr(d, f.name)
        shown = "off" if value is None else ("yes" if value is True else "no" if value is False else value)
        rows.append(f"| `{f.name}` | {shown} | {FIELD_HELP.get(f.name, '')} |")
    name = service.config.model_dir.name if hasattr(service.config.model_dir, "name") else service.config.model_dir
    return (f"### Defaults of {name}\n\n| setting | default | what it does |\n|---|---|---|\n" + "\n".join(rows))


def to_params(service: DocQA, top_k, chunk_size, token_budget, gen_length, threshold, kv_mode, decoder,
              score_margin=None, coverage_gain=None):
    """(AnswerParams, chunk size) from the panel's values; bad values are a clear error."""
    gen = int(gen_length or service.defaults.gen_length)
    if gen % 32:
        raise gr.Error("the answer length must be a multiple of 32")
    k = int(top_k or 0)
    try:
        params = service.params(top_k=k if k > 0 else None, auto_k=k == 0, token_budget=int(token_budget or 0),
                                gen_length=gen, threshold=float(threshold), kv_mode=kv_mode,
                                decoder=decoder, score_margin=None if score_margin is None else float(score_margin),
                                coverage_gain=None if coverage_gain is None else float(coverage_gain))
    except ValueError as exc:
        raise gr.Error(str(exc)) from None
    return params, int(chunk_size or service.defaults.chunk_size)
