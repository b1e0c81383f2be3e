"""``python -m capsule_lib.predict``: the command :mod:`capsule_lib.commands.predict` (this entry module holds nothing
but its call; from Python, :func:`capsule_lib.pretrained.load_trained` and :func:`capsule_lib.evaluation.predict`)."""

if __name__ == "__main__":
    from capsule_lib.commands.predict import main

    main()
