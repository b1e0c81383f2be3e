"""``python -m capsule_lib.train``: the command :mod:`capsule_lib.commands.train` (this entry module holds nothing
but its call)."""

if __name__ == "__main__":
    from capsule_lib.commands.train import main

    main()
