"""``python -m capsule_lib.train.speedrun``: the command :mod:`capsule_lib.commands.speedrun` (this entry module holds
nothing but its call; the library function is :func:`capsule_lib.train.timed.run_speedrun`)."""

if __name__ == "__main__":
    from capsule_lib.commands.speedrun import main

    main()
