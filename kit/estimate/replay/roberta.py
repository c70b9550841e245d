"""RoBERTa: ``transformers.models.roberta.modeling_roberta.RobertaLayer`` (BERT's layer, copied: :func:`.bert.layer`).

The embeddings differ from BERT's in their ids: the position ids are made from the input ids
(``create_position_ids_from_input_ids``: a (B, S) int64 the position embedding keeps) and the token types are
gathered by them (another (B, S) int64, kept by the token-type embedding): the ``id_rows`` mark. The sequence
classifier is ``RobertaClassificationHead`` (:mod:`.task_heads`): dropout on the first token, dense, tanh,
dropout, ``out_proj``; no pooler.
"""
from __future__ import annotations

from kit.estimate.replay import bert
from kit.estimate.replay.families import register_family
from kit.estimate.replay.setup import Covers, around
from kit.estimate.replay.tape import Tape
from kit.estimate.replay.task_heads import Head, encoder_logits, pooler_head


@around(covers=Covers(blocks=("RobertaLayer",),
                      attention=("RobertaAttention", "RobertaSelfAttention", "RobertaSelfOutput"),
                      mlp=("RobertaIntermediate", "RobertaOutput")),
        final_norm=None, embd_dropout=True, embed_norm=True, id_rows=2)
def block(tp: Tape, x):
    return bert.layer(tp, x)


def head(tp: Tape, h) -> Head:
    """``RobertaClassificationHead`` for sequence classification: dropout on the first token (its mask: the first
    token's), ``dense``, tanh (a new output, which it keeps), dropout, ``out_proj``; token classification is BERT's."""
    st = tp.st
    if st.task != "seq-cls":
        return pooler_head(tp, h)
    x = tp.dropout(tp.split(h, st.S)[0], st.p_head)
    dense = tp.linear(x, st.H, st.H, "dense", trainable=st.head_trains, w=st.w_other, quant="none")
    h = tp.new(dense.n, dense.dt, dense.rg)
    tp.save(h, when=h.rg)
    return encoder_logits(tp, h, "out_proj")


register_family("roberta", block=block, config_fields=bert.config_fields, no_grad_loop=bert.LOOP, task_head=head)
