import sys

from harness.device import choose_triton_mode

choose_triton_mode(sys.argv[1:])  # before any kernel module is imported

from harness.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
