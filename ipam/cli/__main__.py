from ipam.cli import main

main()
