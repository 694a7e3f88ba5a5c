from mizuoto.cli import main

main()
