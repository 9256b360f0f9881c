// GORM on pgx (gorm.io/driver/postgres, pgx's database/sql driver), for the app zoo: the
// schema from AutoMigrate (bigserial keys), a pool of ten connections, each step of the flow
// in db.Transaction.
//
// usage: zoo-gorm URL
//
// The line protocol is the zoo's (see ../zoo_protocol.py): `ready N`, then per `step` the
// step's `out ...` lines and `ok`; `quit` closes the pool and prints `done`.
package main

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Pool is the connections the application holds open.
const Pool = 10

// Author is keyed by a bigserial column (GORM's default for a uint ID).
type Author struct {
	ID    uint
	Name  string
	Books []Book
}

// Book belongs to an Author.
type Book struct {
	ID       uint
	AuthorID uint
	Author   Author
	Title    string
	Copies   int
}

func rows(tx *gorm.DB) ([]string, error) {
	var books []Book
	if err := tx.Joins("Author").Order("books.id").Find(&books).Error; err != nil {
		return nil, err
	}
	out := make([]string, 0, len(books))
	for _, b := range books {
		out = append(out, fmt.Sprintf("row %d %s %s %d", b.ID, b.Author.Name, b.Title, b.Copies))
	}
	return out, nil
}

func bookLine(b Book) string {
	return fmt.Sprintf("book %d %d %s %d", b.ID, b.AuthorID, b.Title, b.Copies)
}

var steps = []func(tx *gorm.DB) ([]string, error){
	func(tx *gorm.DB) ([]string, error) {
		ada, brian := Author{Name: "Ada"}, Author{Name: "Brian"}
		if err := tx.Create(&[]*Author{&ada, &brian}).Error; err != nil {
			return nil, err
		}
		books := []Book{
			{AuthorID: ada.ID, Title: "Notes", Copies: 3},
			{AuthorID: ada.ID, Title: "Engines", Copies: 1},
			{AuthorID: brian.ID, Title: "C", Copies: 2},
		}
		if err := tx.Create(&books).Error; err != nil {
			return nil, err
		}
		out := []string{fmt.Sprintf("author %d %s", ada.ID, ada.Name), fmt.Sprintf("author %d %s", brian.ID, brian.Name)}
		for _, b := range books {
			out = append(out, bookLine(b))
		}
		return out, nil
	},
	rows,
	func(tx *gorm.DB) ([]string, error) {
		var ada Author
		if err := tx.Preload("Books", func(db *gorm.DB) *gorm.DB { return db.Order("id") }).
			Where("name = ?", "Ada").First(&ada).Error; err != nil {
			return nil, err
		}
		out := []string{fmt.Sprintf("updated %d", len(ada.Books))}
		for _, b := range ada.Books {
			b.Copies++
			if err := tx.Save(&b).Error; err != nil {
				return nil, err
			}
			out = append(out, fmt.Sprintf("book %d %d", b.ID, b.Copies))
		}
		return out, nil
	},
	func(tx *gorm.DB) ([]string, error) {
		grace := Author{Name: "Grace", Books: []Book{{Title: "Compilers", Copies: 5}}}
		if err := tx.Create(&grace).Error; err != nil {
			return nil, err
		}
		return []string{fmt.Sprintf("author %d %s", grace.ID, grace.Name), bookLine(grace.Books[0])}, nil
	},
	func(tx *gorm.DB) ([]string, error) {
		var b Book
		if err := tx.Where("title = ?", "Engines").First(&b).Error; err != nil {
			return nil, err
		}
		if err := tx.Delete(&b).Error; err != nil {
			return nil, err
		}
		return []string{fmt.Sprintf("deleted %d", b.ID)}, nil
	},
	func(tx *gorm.DB) ([]string, error) {
		var authors, books, copies int64
		if err := tx.Model(&Author{}).Count(&authors).Error; err != nil {
			return nil, err
		}
		if err := tx.Model(&Book{}).Count(&books).Error; err != nil {
			return nil, err
		}
		if err := tx.Model(&Book{}).Select("coalesce(sum(copies), 0)").Scan(&copies).Error; err != nil {
			return nil, err
		}
		all, err := rows(tx)
		if err != nil {
			return nil, err
		}
		return append([]string{fmt.Sprintf("authors %d books %d copies %d", authors, books, copies)}, all...), nil
	},
}

func main() {
	// GORM's default logger (warnings and queries slower than 200 ms), on stderr: stdout carries
	// the protocol.
	logs := logger.New(log.New(os.Stderr, "\n", log.LstdFlags), logger.Config{
		SlowThreshold: 200 * time.Millisecond,
		LogLevel:      logger.Warn,
		Colorful:      false,
	})
	db, err := gorm.Open(postgres.Open(os.Args[1]), &gorm.Config{Logger: logs})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Author{}, &Book{}); err != nil {
		log.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		log.Fatal(err)
	}
	// database/sql keeps only two idle connections by default and closes the others as they
	// come back; an application that holds a pool raises that to the pool's size.
	sqlDB.SetMaxOpenConns(Pool)
	sqlDB.SetMaxIdleConns(Pool)
	ctx := context.Background()
	var wg sync.WaitGroup
	conns := make(chan error, Pool)
	held := make(chan func() error, Pool)
	for range Pool {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := sqlDB.Conn(ctx)
			if err == nil {
				err = c.PingContext(ctx)
				held <- c.Close
			}
			conns <- err
		}()
	}
	wg.Wait()
	close(conns)
	close(held)
	for err := range conns {
		if err != nil {
			log.Fatal(err)
		}
	}
	for release := range held {
		if err := release(); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Printf("ready %d\n", sqlDB.Stats().OpenConnections)
	in := bufio.NewScanner(os.Stdin)
	done := 0
	for in.Scan() {
		command := strings.TrimSpace(in.Text())
		if command == "quit" {
			break
		}
		if command != "step" || done == len(steps) {
			log.Fatalf("unexpected command %q after %d steps", command, done)
		}
		var out []string
		err := db.Transaction(func(tx *gorm.DB) error {
			var err error
			out, err = steps[done](tx)
			return err
		})
		if err != nil {
			log.Fatal(err)
		}
		for _, l := range out {
			fmt.Println("out", l)
		}
		done++
		fmt.Println("ok")
	}
	if err := sqlDB.Close(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("done")
}
