"""Optimal subwords and shared projections (Zhao et al., 2019): a student with its own small WordPiece
vocabulary, trained together with a teacher that reads a mix of both segmentations (dual training),
optionally aligned to the teacher's variables through shared projections (losses/shared_projection.py).

    vocab.py   learn the student vocabulary (Hugging Face tokenizers) and compare it with the teacher's
    dual.py    segment words with both vocabularies; masked-LM batches for student and dual teacher
    models.py  the student and teacher masked-LM models and the teacher's student-vocabulary table/softmax
    train.py   the objective, the variants (NoKD, DualTrain, +SharedProjDown, +SharedProjUp), the loop
"""
