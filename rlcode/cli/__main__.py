from rlcode.cli.command import main

main()
