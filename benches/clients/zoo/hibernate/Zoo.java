// Hibernate ORM on pgjdbc with HikariCP (its default ten connections, all opened at start), for
// the app zoo. Hibernate creates the schema (hbm2ddl): `Author` keyed by an identity column,
// `Book` by Hibernate's default generator, a sequence drawn 50 at a time. Each step of the flow
// is one session in a transaction (`SessionFactory.fromTransaction`).
//
// usage: java -cp CLASSES:JARS Zoo URL  (URL as postgres://user:password@host:port/db)
//
// The line protocol is the zoo's (see ../zoo_protocol.py): `ready N`, then per `step` the
// step's `out ...` lines and `ok`; `quit` closes the pool and prints `done`.

import com.zaxxer.hikari.HikariDataSource;
import jakarta.persistence.Entity;
import jakarta.persistence.GeneratedValue;
import jakarta.persistence.GenerationType;
import jakarta.persistence.Id;
import jakarta.persistence.ManyToOne;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.function.Function;
import org.hibernate.SessionFactory;
import org.hibernate.cfg.Configuration;
import org.hibernate.engine.jdbc.connections.spi.ConnectionProvider;
import org.hibernate.engine.spi.SessionFactoryImplementor;
import org.hibernate.Session;

public class Zoo {
    /** An author, keyed by an identity column. */
    @Entity(name = "Author")
    public static class Author {
        @Id
        @GeneratedValue(strategy = GenerationType.IDENTITY)
        Integer id;

        String name;
    }

    /** A book, keyed by Hibernate's default generator (a sequence). */
    @Entity(name = "Book")
    public static class Book {
        @Id @GeneratedValue Long id;

        @ManyToOne(optional = false)
        Author author;

        String title;
        int copies;

        String line() {
            return "book " + id + " " + author.id + " " + title + " " + copies;
        }
    }

    static Book book(Author author, String title, int copies) {
        Book b = new Book();
        b.author = author;
        b.title = title;
        b.copies = copies;
        return b;
    }

    static Author author(String name) {
        Author a = new Author();
        a.name = name;
        return a;
    }

    static List<String> rows(Session s) {
        List<String> out = new ArrayList<>();
        for (Book b : s.createSelectionQuery("from Book b join fetch b.author order by b.id", Book.class).getResultList()) {
            out.add("row " + b.id + " " + b.author.name + " " + b.title + " " + b.copies);
        }
        return out;
    }

    static final List<Function<Session, List<String>>> STEPS = List.of(
        s -> {
            Author ada = author("Ada"), brian = author("Brian");
            s.persist(ada);
            s.persist(brian);
            List<Book> books = List.of(book(ada, "Notes", 3), book(ada, "Engines", 1), book(brian, "C", 2));
            books.forEach(s::persist);
            s.flush();
            List<String> out = new ArrayList<>(List.of("author " + ada.id + " Ada", "author " + brian.id + " Brian"));
            books.forEach(b -> out.add(b.line()));
            return out;
        },
        Zoo::rows,
        s -> {
            List<Book> books = s.createSelectionQuery("from Book b where b.author.name = 'Ada' order by b.id", Book.class).getResultList();
            List<String> out = new ArrayList<>(List.of("updated " + books.size()));
            for (Book b : books) {
                b.copies += 1;
                out.add("book " + b.id + " " + b.copies);
            }
            return out;
        },
        s -> {
            Author grace = author("Grace");
            s.persist(grace);
            Book b = book(grace, "Compilers", 5);
            s.persist(b);
            s.flush();
            return List.of("author " + grace.id + " Grace", b.line());
        },
        s -> {
            Book b = s.createSelectionQuery("from Book where title = 'Engines'", Book.class).getSingleResult();
            s.remove(b);
            return List.of("deleted " + b.id);
        },
        s -> {
            long authors = s.createSelectionQuery("select count(a) from Author a", Long.class).getSingleResult();
            long books = s.createSelectionQuery("select count(b) from Book b", Long.class).getSingleResult();
            long copies = s.createSelectionQuery("select coalesce(sum(b.copies), 0) from Book b", Long.class).getSingleResult();
            List<String> out = new ArrayList<>(List.of("authors " + authors + " books " + books + " copies " + copies));
            out.addAll(rows(s));
            return out;
        });

    public static void main(String[] args) throws Exception {
        URI url = URI.create(args[0]);
        String[] login = url.getRawUserInfo().split(":", 2);
        String jdbc = "jdbc:postgresql://" + url.getHost() + ":" + url.getPort() + url.getRawPath() + "?sslmode=disable";
        SessionFactory factory = new Configuration()
            .addAnnotatedClass(Author.class)
            .addAnnotatedClass(Book.class)
            .setProperty("hibernate.connection.url", jdbc)
            .setProperty("hibernate.connection.username", URLDecoder.decode(login[0], StandardCharsets.UTF_8))
            .setProperty("hibernate.connection.password", URLDecoder.decode(login[1], StandardCharsets.UTF_8))
            .setProperty("hibernate.connection.provider_class", "org.hibernate.hikaricp.internal.HikariCPConnectionProvider")
            .setProperty("hibernate.hbm2ddl.auto", "create")
            .buildSessionFactory();
        HikariDataSource pool = ((SessionFactoryImplementor) factory).getServiceRegistry()
            .requireService(ConnectionProvider.class).unwrap(HikariDataSource.class);
        // HikariCP opens the pool up to minimumIdle (= maximumPoolSize, 10) in the background.
        long deadline = System.nanoTime() + 60_000_000_000L;
        while (pool.getHikariPoolMXBean().getIdleConnections() < pool.getMaximumPoolSize()) {
            if (System.nanoTime() > deadline) {
                throw new IllegalStateException("HikariCP did not open its pool within 60 s");
            }
            Thread.sleep(10);
        }
        System.out.println("ready " + pool.getHikariPoolMXBean().getTotalConnections());
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        int done = 0;
        for (String line; (line = in.readLine()) != null; ) {
            String command = line.trim();
            if (command.equals("quit")) {
                break;
            }
            if (!command.equals("step") || done == STEPS.size()) {
                throw new IllegalStateException("unexpected command " + command + " after " + done + " steps");
            }
            for (String out : factory.fromTransaction(STEPS.get(done))) {
                System.out.println("out " + out);
            }
            done++;
            System.out.println("ok");
        }
        factory.close();
        System.out.println("done");
    }
}
