"""The tasks a run trains on, one module each: a synthetic task (``synthetic``), translation
(``translation``: from the text files, ``translation_files``, or from a prepared folder,
``translation_prepared``) and constituency parsing (``parsing``). Each reads its data, makes its
vocabulary and validator, and hands them to the shared ``training.fit.fit``."""
