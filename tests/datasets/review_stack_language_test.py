import numpy as np

from keras_attnvariants.datasets.stack_language import stack_language

SYMBOLS = "01234()"


def test_dependency_span_determines_the_depth_and_is_minimal():
    # Independent of the generator's bookkeeping: an explicit stack gives
    # the depth after each token; the span of row i alone must give that
    # depth (its first token is a number, or it starts the sequence), and
    # without its first token the span holds no number, so it could not.
    data = stack_language(100, length=12, seed=5)
    for tokens, deps in zip(data["tokens"], data["dependencies"]):
        stack, depths = 0, []
        for t in (SYMBOLS[t] for t in tokens):
            stack += (t == "(") - (t == ")")
            depths.append(stack)
        for i in range(len(tokens)):
            span = np.flatnonzero(deps[i])
            assert span.tolist() == list(range(span[0], i + 1))
            text = [SYMBOLS[t] for t in tokens[span]]
            start = int(text[0]) if text[0].isdigit() else 0
            if not text[0].isdigit():
                assert span[0] == 0 and not any(c.isdigit() for c in text)
            moves = sum((c == "(") - (c == ")") for c in text[1:])
            first = text[0] if not text[0].isdigit() else ""
            moves += (first == "(") - (first == ")")
            assert start + moves == depths[i]
            assert not any(c.isdigit() for c in text[1:])
