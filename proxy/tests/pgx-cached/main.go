// Runs one query twice with pgx's statement cache (its default mode), waiting for a line on
// standard input in between, and prints each row as `name=value` pairs (run by
// proxy/tests/mobility.rs: the table changes shape while the session is parked between the
// two runs, and pgx must see the new shape as it would directly on Postgres).
//
// usage: pgx-cached URL QUERY
//
// Prints one line per run: the row, or `error MESSAGE`.
package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
)

func run(ctx context.Context, conn *pgx.Conn, query string) string {
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return "error " + err.Error()
	}
	row, err := pgx.CollectExactlyOneRow(rows, pgx.RowToMap)
	if err != nil {
		return "error " + err.Error()
	}
	var parts []string
	for _, f := range rows.FieldDescriptions() {
		parts = append(parts, fmt.Sprintf("%s=%v", f.Name, row[f.Name]))
	}
	return strings.Join(parts, " ")
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: pgx-cached URL QUERY")
		os.Exit(2)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Args[1])
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	defer conn.Close(ctx)
	fmt.Println(run(ctx, conn, os.Args[2]))
	bufio.NewReader(os.Stdin).ReadString('\n')
	fmt.Println(run(ctx, conn, os.Args[2]))
}
