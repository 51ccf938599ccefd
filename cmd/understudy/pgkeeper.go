package main

import (
	"os"

	"github.com/spf13/cobra"

	"understudy/capabilities/postgres"
)

// newPgKeeperCmd is the PostgreSQL keeper process a node starts for each
// postgres member (capabilities/postgres): the parent of the postmaster,
// which stops it when the node dies or stops petting it. Not for people.
func newPgKeeperCmd() *cobra.Command {
	return &cobra.Command{
		Use:                postgres.KeeperSubcommand,
		Short:              "The keeper of a node's PostgreSQL (started by the node itself)",
		Hidden:             true,
		DisableFlagParsing: true,
		Run: func(_ *cobra.Command, args []string) {
			os.Exit(postgres.KeeperMain(args))
		},
	}
}
