// pgx v5 with pgxpool: 10 pooled connections, one query per interval (fidelity benchmark).
//
// usage: pgx-pool-app URL EVERY_MS QUERIES
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: pgx-pool-app URL EVERY_MS QUERIES")
		os.Exit(2)
	}
	everyMs, err1 := strconv.Atoi(os.Args[2])
	queries, err2 := strconv.Atoi(os.Args[3])
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "EVERY_MS and QUERIES are whole numbers")
		os.Exit(2)
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Args[1])
	check(err)
	cfg.MinConns, cfg.MaxConns = 10, 10
	// Keep idle connections for the whole run, as an application holding its pool does.
	cfg.MaxConnIdleTime, cfg.MaxConnLifetime = time.Hour, time.Hour
	cfg.HealthCheckPeriod = time.Hour
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	check(err)
	var held []*pgxpool.Conn
	for i := 0; i < 10; i++ {
		c, err := pool.Acquire(ctx)
		check(err)
		held = append(held, c)
	}
	for _, c := range held {
		var n int
		check(c.QueryRow(ctx, "select 1").Scan(&n))
		c.Release()
	}
	fmt.Println("ready")
	every := time.Duration(everyMs) * time.Millisecond
	start := time.Now()
	for i := 0; i < queries; i++ {
		time.Sleep(time.Until(start.Add(every/2 + time.Duration(i)*every)))
		var n int
		check(pool.QueryRow(ctx, "select $1::int + 1", i).Scan(&n))
		fmt.Printf("query %d\n", i)
	}
	time.Sleep(time.Until(start.Add(time.Duration(queries) * every)))
	pool.Close()
	fmt.Println("done")
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
