"""The in-place beam search of generation_vanilla_transformer.py: the same tokens as transformers' own loop,
its pieces against the plain operations they replace, and its fallback where it was not tested."""

import copy
import inspect
import itertools
import json
import logging
import math
import re

import pytest
import torch
import transformers
from conftest import EOS, random_ids, tiny_model

import vanilla_transformer.generation_vanilla_transformer as generation
from vanilla_transformer.generation_vanilla_transformer import top_k


def test_beam_search_cache_layer_reordering_as_it_grows_equals_transformers_layer():
    """Reorderings recorded and applied at the next update (two in a row composed) give DynamicLayer's
    keys and values, which reorders at once and concatenates."""
    from transformers.cache_utils import DynamicLayer

    from vanilla_transformer.generation_vanilla_transformer import BeamSearchSelfAttentionLayer

    ours, plain = BeamSearchSelfAttentionLayer(), DynamicLayer()
    g = torch.Generator().manual_seed(0)
    orders = [
        [],
        [torch.tensor([1, 1, 0, 3, 2, 2])],
        [torch.tensor([5, 4, 3, 2, 1, 0]), torch.tensor([0, 0, 1, 1, 4, 4])],
        [],
    ]
    for step, reorders in enumerate(orders):
        key, value = (
            torch.randn(6, 2, 2 if step == 0 else 1, 4, generator=g),
            torch.randn(6, 2, 2 if step == 0 else 1, 4, generator=g),
        )
        got, expected = ours.update(key, value), plain.update(key, value)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), step
        for order in reorders:
            ours.reorder_cache(order)
            plain.reorder_cache(order)
    assert ours.get_seq_length() == plain.get_seq_length() == 5


@pytest.mark.parametrize(
    "options",
    [
        dict(num_beams=4),  # the paper's per-sentence limit: source length + source_length_offset
        dict(num_beams=4, max_new_tokens=9, min_new_tokens=2, early_stopping=False, length_penalty=0.0),
        dict(
            num_beams=3,
            max_new_tokens=8,
            min_length=4,
            early_stopping="never",
            length_penalty=-0.5,
            num_return_sequences=2,
        ),
        dict(num_beams=4, max_new_tokens=12, early_stopping="never", length_penalty=0.6),
    ],
)
def test_in_place_beam_search_gives_transformers_beam_search_tokens(monkeypatch, options):
    model = tiny_model()
    with torch.no_grad():  # make </s> likely enough that some hypotheses end early and others do not
        direction = torch.randn(32, generator=torch.Generator().manual_seed(1))
        model.model.decoder.layers[-1].final_layer_norm.bias.copy_(0.3 * direction)
        model.model.shared.weight[EOS] = 3 * direction / direction.norm()
    model.generation_config.source_length_offset = 3
    src = random_ids(4, 7, seed=5)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4, [1] * 6 + [0]])
    fast = model.generate(src, attention_mask=mask, **options)
    applied = []
    check = generation.in_place_beam_search_applies
    monkeypatch.setattr(
        generation, "in_place_beam_search_applies", lambda *args: applied.append(check(*args)) and False
    )
    plain = model.generate(src, attention_mask=mask, **options)  # transformers' own loop
    assert applied == [True]  # the first call took the in-place loop
    assert torch.equal(fast, plain)
    assert (plain[:, 1:] == EOS).any()  # some hypotheses ended: finished beams were exercised


@pytest.mark.parametrize(
    "overrides",
    [
        dict(encoder_attention_heads=3, decoder_attention_heads=5, head_dim=4),
        dict(encoder_attention_heads=3, decoder_attention_heads=5, head_dim=12),
        dict(attention_bias=True),
    ],
    ids=["3 and 5 heads of 4", "3 and 5 heads of 12", "attention biases"],
)
def test_in_place_beam_search_with_other_attention_shapes_gives_transformers_tokens_and_groups_the_beams(
    monkeypatch, overrides
):
    """Heads of head_dim (3 and 5 of them: h·d_k ≠ d_model), and projections with biases, through the in-place loop,
    whose attention hook gives the decoder one encoder row per sentence: transformers' tokens, and the logits of
    repeated encoder rows."""
    model = tiny_model(**overrides)
    with torch.no_grad():
        for name, linear in model.named_modules():  # attention biases start at zero: make them count
            if name.endswith("_proj") and linear.bias is not None:
                torch.nn.init.normal_(linear.bias, 0.0, 0.3)
    with torch.no_grad():  # make </s> likely enough that some hypotheses end early and others do not
        direction = torch.randn(32, generator=torch.Generator().manual_seed(1))
        model.model.decoder.layers[-1].final_layer_norm.bias.copy_(0.3 * direction)
        model.model.shared.weight[EOS] = 3 * direction / direction.norm()
    model.generation_config.source_length_offset = 3
    src = random_ids(4, 7, seed=5)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4, [1] * 6 + [0]])
    fast = model.generate(src, attention_mask=mask, num_beams=4)
    applied = []
    check = generation.in_place_beam_search_applies
    monkeypatch.setattr(
        generation, "in_place_beam_search_applies", lambda *args: applied.append(check(*args)) and False
    )
    plain = model.generate(src, attention_mask=mask, num_beams=4)  # transformers' own loop
    assert applied == [True] and torch.equal(fast, plain)
    assert (plain[:, 1:] == EOS).any()  # some hypotheses ended: finished beams were exercised

    tgt = random_ids(16, 5, seed=1)
    encoder_hidden = model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state
    shared = model(
        encoder_outputs=(encoder_hidden,), attention_mask=mask, decoder_input_ids=tgt, beams_per_encoder_row=4
    ).logits
    repeated = model(
        encoder_outputs=(encoder_hidden.repeat_interleave(4, 0),),
        attention_mask=mask.repeat_interleave(4, 0),
        decoder_input_ids=tgt,
    ).logits
    torch.testing.assert_close(shared, repeated, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [244, 4 * 8000, 4 * 37000 + 3, 70])
def test_top_k_through_chunk_maxima_equals_torch_topk(n):
    g = torch.Generator().manual_seed(n)
    scores = torch.randn(6, 1, n, generator=g)
    scores[1, 0, torch.randperm(n, generator=g)[:5]] += 10  # the largest values crowded into a few places
    scores[2, 0, : n - 60] -= 20  # ... or all in the last, shorter chunk
    values, indices = top_k(scores, 8)
    expected_values, expected_indices = torch.topk(scores.flatten(1), 8)
    assert torch.equal(values, expected_values) and torch.equal(indices, expected_indices)
    # ties (masked scores): the same values, each index pointing at its value, no index twice
    scores[3, 0, 3:] = -math.inf  # a row with 3 finite scores, as when </s> is forced
    scores[4] = scores[4].round()  # many equal values
    values, indices = top_k(scores, 8)
    assert torch.equal(values, torch.topk(scores.flatten(1), 8).values)
    assert torch.equal(scores.flatten(1).gather(1, indices), values)
    assert all(len(set(row)) == 8 for row in indices.tolist())


@pytest.mark.parametrize("n", [1000, 1024, 37, 4])  # 4: too few chunks, a plain top-k of the sums
def test_top_k_with_offsets_equals_torch_topk_of_the_sums(n):
    """Beam search's use: log-probabilities [sentences, beams, vocab] plus each beam's score, top 8 over
    beams × vocabulary; the offsets reach the sums without the sums' full tensor."""
    g = torch.Generator().manual_seed(n)
    scores = torch.randn(5, 4, n, generator=g).log_softmax(-1)
    offsets = torch.randn(5, 4, generator=g) * 3
    offsets[0, 1:] = -1e9  # the first step: only beam 0 is live
    offsets[1] = torch.tensor([0.0, -0.5, -30.0, -0.25])  # one beam far behind, its best chunks never chosen
    scores[2, 3, -5:] += 40  # the best sums in one beam's tail
    values, indices = top_k(scores, 8, offsets=offsets)
    expected_values, expected_indices = torch.topk((scores + offsets[..., None]).flatten(1), 8)
    assert torch.equal(values, expected_values) and torch.equal(indices, expected_indices)


def test_in_place_beam_search_leaves_other_processors_and_outputs_to_transformers():
    from transformers import (
        DynamicCache,
        EncoderDecoderCache,
        LogitsProcessorList,
        NoRepeatNGramLogitsProcessor,
        StaticCache,
    )

    config = tiny_model().generation_config
    kwargs = {"use_cache": True, "cache": EncoderDecoderCache(DynamicCache(), DynamicCache())}

    def applies(processors, config=config, synced_gpus=False, kwargs=kwargs, attn="sdpa"):
        return generation.in_place_beam_search_applies(
            LogitsProcessorList(processors), config, synced_gpus, kwargs, attn
        )

    assert applies([]) and applies([], attn="eager")
    assert not applies([NoRepeatNGramLogitsProcessor(2)])
    assert not applies([], synced_gpus=True)
    assert not applies([], kwargs={"use_cache": False})
    assert not applies([], kwargs={**kwargs, "cache": DynamicCache()})
    static = EncoderDecoderCache(StaticCache(config=tiny_model().config, max_cache_len=8), DynamicCache())
    assert not applies([], kwargs={**kwargs, "cache": static})  # transformers' compiled route
    assert not applies([], attn="flex_attention")  # its block masks are not grouped by sentence
    with_scores = copy.deepcopy(config)
    with_scores.return_dict_in_generate = True
    assert not applies([], config=with_scores)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_decoder_rows_sharing_one_encoder_row_equal_rows_with_repeated_encoder_outputs(attn):
    """Beam search gives the decoder one encoder row per sentence for its k beams (consecutive rows):
    logits, cross-attention weights and cached decoding equal those with the encoder rows repeated."""
    model = tiny_model()
    model.set_attn_implementation(attn)
    src, tgt = random_ids(3, 7), random_ids(12, 5, seed=1)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    encoder_hidden = model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state
    outputs = {}
    for name, (hidden, src_mask, group) in {
        "shared": (encoder_hidden, mask, 4),
        "repeated": (encoder_hidden.repeat_interleave(4, 0), mask.repeat_interleave(4, 0), 1),
    }.items():
        full = model(
            encoder_outputs=(hidden,),
            attention_mask=src_mask,
            decoder_input_ids=tgt,
            output_attentions=attn == "eager",
            beams_per_encoder_row=group,
        )
        cache, steps = None, []
        for t in range(tgt.shape[1]):
            step = model(
                encoder_outputs=(hidden,),
                attention_mask=src_mask,
                decoder_input_ids=tgt[:, t : t + 1],
                cache=cache,
                use_cache=True,
                beams_per_encoder_row=group,
            )
            cache, _ = step.cache, steps.append(step.logits)
        outputs[name] = (full, torch.cat(steps, 1), cache.cross_attention_cache.layers[0].keys.shape[0])
    (shared, shared_steps, shared_rows), (repeated, repeated_steps, repeated_rows) = (
        outputs["shared"],
        outputs["repeated"],
    )
    assert torch.allclose(shared.logits, repeated.logits, atol=1e-5)
    assert torch.allclose(shared_steps, repeated_steps, atol=1e-5) and torch.allclose(
        shared_steps, shared.logits, atol=1e-5
    )
    assert (shared_rows, repeated_rows) == (3, 12)  # cross-attention keys kept once per sentence
    if attn == "eager":
        for a, b in zip(shared.cross_attentions, repeated.cross_attentions):
            assert a.shape == (12, 4, 5, 7) and torch.allclose(a, b, atol=1e-6)


def test_grouped_beams_are_an_explicit_choice_and_their_rows_must_match(model):
    """Only ``beams_per_encoder_row`` groups decoder rows over encoder rows: without it, a decoder batch that does not
    match the encoder's is an error of the attention, not a grouping guessed from the shapes."""
    encoder_outputs = model.get_encoder()(input_ids=random_ids(3, 6))
    with pytest.raises(
        ValueError, match="beams_per_encoder_row=4 needs 4 decoder rows per encoder row, but the decoder has 10 rows"
    ):
        model(encoder_outputs=encoder_outputs, decoder_input_ids=random_ids(10, 2), beams_per_encoder_row=4)
    with pytest.raises(RuntimeError):
        model(encoder_outputs=encoder_outputs, decoder_input_ids=random_ids(12, 2))


def test_beam_search_projects_cross_attention_keys_once_per_sentence(model):
    rows = []
    handle = model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(
        lambda m, i, out: rows.append(out.shape[0])
    )
    model.generate(random_ids(3, 5), num_beams=4, max_new_tokens=6, min_new_tokens=6)
    handle.remove()
    assert rows == [3]  # one projection, of the 3 sentences (not of 3 × 4 beams)


# ------------------------------------------------------------------ fails safe: only where it was tested
def _eos_prone_model():
    """A tiny model for which </s> is likely enough that some beams end early and others do not."""
    model = tiny_model()
    with torch.no_grad():
        direction = torch.randn(32, generator=torch.Generator().manual_seed(1))
        model.model.decoder.layers[-1].final_layer_norm.bias.copy_(0.3 * direction)
        model.model.shared.weight[EOS] = 3 * direction / direction.norm()
    model.generation_config.source_length_offset = 3
    return model


def _generate_counting_fast_steps(model, monkeypatch, **options):
    """generate()'s tokens, and how many steps the in-place loop took (0: transformers' loop ran)."""
    steps = []
    monkeypatch.setattr(generation, "top_k", lambda *args, **kwargs: steps.append(1) or top_k(*args, **kwargs))
    src = random_ids(4, 7, seed=5)
    mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4, [1] * 6 + [0]])
    tokens = model.generate(src, attention_mask=mask, **options)
    monkeypatch.setattr(generation, "top_k", top_k)
    return tokens, len(steps)


def test_the_in_place_beam_search_runs_on_the_transformers_installed_here():
    """The development set-up pins a tested transformers: there the fast path must be the one that runs."""
    assert transformers.__version__ in generation.TESTED_TRANSFORMERS_VERSIONS
    assert generation.in_place_beam_search_unavailable() is None
    model = tiny_model()
    rows = []
    model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(lambda m, i, out: rows.append(out.shape[0]))
    model.generate(random_ids(3, 5), num_beams=4, max_new_tokens=4)
    assert rows == [3]  # only the in-place loop gives the decoder one encoder row per sentence


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def info_lines():
    """The info-level lines the generation module logs during a test."""
    logger, handler = logging.getLogger(generation.__name__), _Messages()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.mark.parametrize("untested", ["5.99.0", "a release with one private name renamed"])
def test_where_untested_transformers_own_beam_search_gives_the_same_tokens(monkeypatch, info_lines, untested):
    """(a) a transformers release not in TESTED_TRANSFORMERS_VERSIONS, (b) one private name missing:
    transformers' own loop runs, says so once at info level, and gives the fast path's tokens."""
    model = _eos_prone_model()
    fast = {beams: _generate_counting_fast_steps(model, monkeypatch, num_beams=beams) for beams in (1, 4)}
    assert fast[4][1] > 0  # the fast path ran for beam 4 (greedy never takes it)
    if untested == "5.99.0":
        monkeypatch.setattr(transformers, "__version__", untested)
        reason = "transformers 5.99.0 is not among the tested releases"
    else:
        monkeypatch.setattr(
            generation, "PRIVATE_GENERATION_METHODS", (*generation.PRIVATE_GENERATION_METHODS, "_renamed")
        )
        reason = "has no _renamed"
    for beams in (1, 4):
        tokens, fast_steps = _generate_counting_fast_steps(model, monkeypatch, num_beams=beams)
        assert fast_steps == 0
        assert torch.equal(tokens, fast[beams][0]), beams
    assert (fast[4][0][:, 1:] == EOS).any()  # some beams ended: finished hypotheses were compared too
    said = [line for line in info_lines if "In-place beam search off" in line]
    assert len(said) == 1 and reason in said[0], info_lines


def test_the_private_names_listed_are_exactly_those_the_loop_uses():
    """PRIVATE_GENERATION_METHODS / _CONFIG_ATTRIBUTES must name every private transformers name the
    in-place loop reads, so that a release renaming one of them turns the fast path off."""
    source = inspect.getsource(generation.VanillaTransformerGenerationMixin._in_place_beam_search)
    own = {name for name in vars(generation.VanillaTransformerGenerationMixin) if name.startswith("_")}
    used_methods = set(re.findall(r"self\.(_[a-z]\w*)", source)) - own
    used_config = set(re.findall(r"(?<!self\.)config\.(_[a-z]\w*)", source))  # the generation config, not the model's
    assert used_methods | {"_beam_search"} == set(generation.PRIVATE_GENERATION_METHODS)
    assert used_config == set(generation.PRIVATE_GENERATION_CONFIG_ATTRIBUTES)
    for name in generation.PRIVATE_GENERATION_METHODS:
        assert hasattr(transformers.GenerationMixin, name), name


# ------------------------------------------------------------------ continuing from a returned cache
CONTINUE = dict(
    eos_token_id=None, forced_eos_token_id=None, return_dict_in_generate=True, output_scores=True, use_cache=True
)


def _cache_tensors(cache) -> list[torch.Tensor]:
    return [
        t
        for sub in (cache.self_attention_cache, cache.cross_attention_cache)
        for layer in sub.layers
        for t in (layer.keys, layer.values)
    ]


def _continue(model, src, mask, first, num_beams, cache):
    """generate() again from ``first``'s sequences, with ``cache`` (or none), for one more token."""
    return model.generate(
        src,
        attention_mask=mask,
        decoder_input_ids=first.sequences,
        decoder_attention_mask=torch.ones_like(first.sequences),
        cache=cache,
        max_new_tokens=1,
        num_beams=num_beams,
        **CONTINUE,
    )


def test_greedy_generation_continued_from_its_cache_equals_one_call():
    """transformers' own check (GenerationTesterMixin.test_generate_continue_from_past_key_values): 4 tokens at
    once, or 3 and then 1 more from the returned cache, give the same tokens, scores and caches."""
    model = tiny_model()
    src, mask = random_ids(2, 7), torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    once = model.generate(src, attention_mask=mask, max_new_tokens=4, num_beams=1, **CONTINUE)
    first = model.generate(src, attention_mask=mask, max_new_tokens=3, num_beams=1, **CONTINUE)
    then = _continue(model, src, mask, first, 1, first.cache)
    assert torch.equal(once.sequences, then.sequences)
    for a, b in zip(once.scores, first.scores + then.scores, strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(_cache_tensors(once.cache), _cache_tensors(then.cache), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("num_return_sequences", [1, 2])
def test_beam_search_returns_the_cache_of_the_sequences_it_returns(num_return_sequences):
    """After beam search the returned cache holds the keys and values of the returned sequences (each row repeated
    for the beams of the next call), so that continuing from it equals continuing without it. transformers' loop
    leaves the running beams' caches there, which belong to other hypotheses than the returned best ones."""
    model = tiny_model()
    src, mask = random_ids(2, 7), torch.tensor([[1] * 7, [1] * 5 + [0] * 2])
    first = model.generate(
        src, attention_mask=mask, max_new_tokens=3, num_beams=4, num_return_sequences=num_return_sequences, **CONTINUE
    )
    # the keys and values of the returned sequences but their last token, computed afresh, one row per beam to come
    rows = first.sequences[:, :-1].repeat_interleave(4, dim=0)
    expanded = dict(
        input_ids=src.repeat_interleave(4 * num_return_sequences, 0),
        attention_mask=mask.repeat_interleave(4 * num_return_sequences, 0),
    )
    fresh = model(**expanded, decoder_input_ids=rows, use_cache=True).cache
    for a, b in zip(_cache_tensors(first.cache), _cache_tensors(fresh), strict=True):
        torch.testing.assert_close(a, b)
    src, mask = (t.repeat_interleave(num_return_sequences, 0) for t in (src, mask))
    with_cache = _continue(model, src, mask, first, 4, first.cache)
    without = _continue(model, src, mask, first, 4, None)
    assert torch.equal(with_cache.sequences, without.sequences)
    torch.testing.assert_close(with_cache.scores[0], without.scores[0])


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_decoding_step_reads_nothing_back_and_generate_reads_one_value_a_step(num_beams):
    """Each value read back to the host (``.item()``, ``bool(tensor)``...: ``aten._local_scalar_dense``) would wait for
    a GPU. The model's forward in a decoding step reads none: generate() checks the ids once per call, and masks are
    used as given, not read to see whether they could be skipped. What remains is once per call, plus the loop's own
    question at each step, "is a sentence still running?" (transformers' loop and the in-place beam search alike)."""
    from test_training import CountReadsBack

    model, source = tiny_model(), random_ids(2, 7)
    mask = torch.ones_like(source)
    mask[1, 5:] = 0
    counter, in_forward, forward_reads = CountReadsBack(), [], []
    model.register_forward_pre_hook(lambda module, args: in_forward.append(counter.per_step[-1]))
    model.register_forward_hook(
        lambda module, args, output: forward_reads.append(counter.per_step[-1] - in_forward.pop())
    )
    steps = 10
    with counter.mode, torch.no_grad():
        model.generate(source, attention_mask=mask, num_beams=num_beams, max_new_tokens=steps, min_new_tokens=steps)
    assert len(forward_reads) == steps and forward_reads == [0] * steps
    assert steps <= counter.per_step[-1] <= steps + 8, counter.per_step


# ------------------------------------------------------------------ the length penalty's form: |Y|^α or GNMT's
def _best_by_enumeration(model, src: torch.Tensor, length: int, alpha: float, form: str) -> list[list[int]]:
    """Every output of at most ``length`` tokens (ended by </s>, or cut at ``length``), scored by the model and
    normalised by |Y|^α or GNMT's ((5 + |Y|) / 6)^α: each sentence's best, padded as generate pads."""
    vocab, best = model.config.vocab_size, []
    prefixes = [[1, *ys] for ys in itertools.product(range(vocab), repeat=length - 1)]  # every decoder input
    for row in src:
        with torch.no_grad():  # one pass scores every output: row p holds the log-probabilities after prefix p
            log_probs = model(
                input_ids=row[None].expand(len(prefixes), -1), decoder_input_ids=torch.tensor(prefixes)
            ).logits.log_softmax(-1)
        candidates = []
        for n in range(1, length + 1):
            for ys in itertools.product(range(vocab), repeat=n):
                if EOS in ys[:-1] or (n < length and ys[-1] != EOS):
                    continue
                p = prefixes.index([1, *ys[:-1], *[0] * (length - n)])
                score = sum(log_probs[p, i, y].item() for i, y in enumerate(ys))
                penalty = n**alpha if form == "power" else generation.gnmt_length_penalty(n, alpha)
                candidates.append((score / penalty, [*ys] + [0] * (length - n)))
        best.append(max(candidates)[1])
    return best


#: Beam search over three tokens with a beam of every two-token prefix (8 × 8) never drops a hypothesis: exhaustive.
EXHAUSTIVE = dict(num_beams=64, max_new_tokens=3, early_stopping="never")


@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_both_length_penalty_forms_find_the_best_output_by_enumeration(monkeypatch, alpha):
    """Exhaustive beam search (EXHAUSTIVE): each form's output is the best of all outputs under that form, found by
    enumerating them; the two forms choose differently for some sentences, so each is tested on its own. transformers'
    loop knows only |Y|^α: there, GNMT's form gives one warning and |Y|^α's tokens."""
    model, src = tiny_model(vocab_size=8), random_ids(6, 5, vocab=8, seed=2)
    options = dict(**EXHAUSTIVE, length_penalty=alpha)
    found = {}
    for form in generation.LENGTH_PENALTY_FORMS:
        found[form] = model.generate(src, length_penalty_form=form, **options)[:, 1:].tolist()
        assert found[form] == _best_by_enumeration(model, src, 3, alpha, form), form
    assert found["power"] != found["gnmt"]

    monkeypatch.setattr(generation, "in_place_beam_search_applies", lambda *args: False)
    lines = []
    monkeypatch.setattr(generation.logger, "warning_once", lambda message: lines.append(message))
    assert model.generate(src, **options)[:, 1:].tolist() == found["power"]
    assert lines == []
    assert model.generate(src, length_penalty_form="gnmt", **options)[:, 1:].tolist() == found["power"]
    assert len(lines) == 1 and "transformers' beam search ranks by log P / |Y|^α instead" in lines[0]


def test_a_length_penalty_form_is_checked_saved_and_taken_by_models_saved_before_it(tmp_path):
    """A wrong form is refused by name; the form is saved in generation_config.json; a generation_config.json from
    before the field existed decodes with |Y|^α, and still takes the argument."""
    model, src = tiny_model(vocab_size=8), random_ids(6, 5, vocab=8, seed=2)
    with pytest.raises(ValueError, match="length_penalty_form='gnm' is not one of 'power', 'gnmt'"):
        model.generate(src, length_penalty_form="gnm")
    options = dict(**EXHAUSTIVE, length_penalty=2.0)
    power, gnmt = (model.generate(src, length_penalty_form=form, **options) for form in ("power", "gnmt"))
    model.generation_config.length_penalty_form = "gnmt"
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "generation_config.json").read_text())
    assert saved["length_penalty_form"] == "gnmt"
    assert torch.equal(type(model).from_pretrained(tmp_path).generate(src, **options), gnmt)
    del saved["length_penalty_form"]
    (tmp_path / "generation_config.json").write_text(json.dumps(saved))
    older = type(model).from_pretrained(tmp_path)
    assert not hasattr(older.generation_config, "length_penalty_form")
    assert torch.equal(older.generate(src, **options), power)
    assert torch.equal(older.generate(src, length_penalty_form="gnmt", **options), gnmt)
