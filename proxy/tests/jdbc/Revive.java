// A pgjdbc client for proxy/tests/jdbc.rs: sets session state, runs a server-prepared
// statement, waits for a line on stdin (the test lets the tenant sleep meanwhile), then runs the
// same statement again and shows the settings. Prints `key=value` lines the test asserts.
//
// Usage: java -cp '<driver jars>/*' Revive.java <jdbc url>   (password in PGWAKE_PASSWORD)

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import org.postgresql.PGStatement;

public class Revive {
  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    props.setProperty("user", "pgwake");
    props.setProperty("password", System.getenv("PGWAKE_PASSWORD"));
    props.setProperty("sslmode", "disable");
    // Server-prepare (a named statement, S_n) on the first execution rather than the fifth.
    props.setProperty("prepareThreshold", "1");
    // Seconds: a stuck wake or revival fails the program instead of hanging the test.
    props.setProperty("connectTimeout", "60");
    props.setProperty("socketTimeout", "60");

    try (Connection conn = DriverManager.getConnection(args[0], props)) {
      try (Statement st = conn.createStatement()) {
        st.execute("CREATE SCHEMA app");
        st.execute("CREATE TABLE app.items (id int PRIMARY KEY, name text)");
        st.execute("INSERT INTO app.items VALUES (1, 'one'), (2, 'two')");
        st.execute("SET search_path = app, public");
        st.execute("SET statement_timeout = '5s'");
        st.execute("SET app.x = 'hello'");
      }
      // `items` resolves through search_path: a revival that re-prepared before restoring the
      // settings would fail here.
      PreparedStatement byId = conn.prepareStatement("SELECT name FROM items WHERE id = ?");
      System.out.println("before=" + name(byId, 1));
      System.out.println("server_prepared=" + byId.unwrap(PGStatement.class).isUseServerPrepare());
      System.out.println("prepared_before=" + prepared(conn));
      System.out.println("pid_before=" + single(conn, "SELECT pg_backend_pid()"));
      System.out.println("ready");
      System.out.flush();

      BufferedReader stdin = new BufferedReader(new InputStreamReader(System.in));
      if (stdin.readLine() == null) {
        throw new IllegalStateException("stdin closed before the go-ahead");
      }

      System.out.println("after=" + name(byId, 2));
      System.out.println("again=" + name(byId, 1));
      System.out.println("prepared_after=" + prepared(conn));
      System.out.println("pid_after=" + single(conn, "SELECT pg_backend_pid()"));
      for (String setting : new String[] {"search_path", "statement_timeout", "app.x"}) {
        System.out.println(setting + "=" + single(conn, "SHOW " + setting));
      }
      byId.close();
    }
    System.out.println("done");
  }

  static String name(PreparedStatement ps, int id) throws SQLException {
    ps.setInt(1, id);
    try (ResultSet rs = ps.executeQuery()) {
      return rs.next() ? rs.getString(1) : "<no row>";
    }
  }

  // The backend's named prepared statements of the `items` query, as `name:parameter types`.
  static String prepared(Connection conn) throws SQLException {
    List<String> out = new ArrayList<>();
    try (Statement st = conn.createStatement();
        ResultSet rs =
            st.executeQuery(
                "SELECT name, parameter_types::text FROM pg_prepared_statements"
                    + " WHERE statement = 'SELECT name FROM items WHERE id = $1' ORDER BY name")) {
      while (rs.next()) {
        out.add(rs.getString(1) + ":" + rs.getString(2));
      }
    }
    return String.join(",", out);
  }

  static String single(Connection conn, String sql) throws SQLException {
    try (Statement st = conn.createStatement();
        ResultSet rs = st.executeQuery(sql)) {
      rs.next();
      return rs.getString(1);
    }
  }
}
