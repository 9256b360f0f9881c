// Connects with a connection string exactly as given and prints the database the session is in
// (run by proxy/tests/quickstart.rs to check the strings the quickstart prints).
//
// usage: connect-from URL
//
// Prints `ok DATABASE`, or `error MESSAGE` when pgx refuses; exits 0 either way.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: connect-from URL")
		os.Exit(2)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Args[1])
	if err != nil {
		fmt.Println("error", strings.ReplaceAll(err.Error(), "\n", " "))
		return
	}
	defer conn.Close(ctx)
	var db string
	if err := conn.QueryRow(ctx, "select current_database()").Scan(&db); err != nil {
		fmt.Println("error", strings.ReplaceAll(err.Error(), "\n", " "))
		return
	}
	fmt.Println("ok", db)
}
