"""Serving a trained model over HTTP (``transduce serve``; ``pip install 'transduce[serve]'``).

``server``: the FastAPI app and the uvicorn process around it; ``requests``: what a request may
hold and how its body is read; ``guard``: the API key, the header deadline and the open-file
limit; ``dynamic_batching``: concurrent requests share one batched ``translate`` call;
``models``: the models of one server, a language pair each; ``libretranslate``: the
LibreTranslate API beside the native one. None of it imports a model: the app is given a
``Translator`` (``transduce.inference.translator``) or anything with its ``translate``. fastapi
and uvicorn are imported by ``server``, ``guard`` and ``libretranslate`` (starlette by
``requests``), so ``import transduce.serve`` needs neither.
"""
