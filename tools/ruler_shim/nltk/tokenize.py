from engine.method.sentences import split_sentences


def sent_tokenize(text, language="english"):
    return split_sentences(text)
