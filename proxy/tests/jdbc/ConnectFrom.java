// Connects with a JDBC URL exactly as given and prints the database the session is in (run by
// proxy/tests/quickstart.rs to check the JDBC URL the quickstart prints).
//
// usage: java -cp <pgjdbc> ConnectFrom.java URL
//
// Prints `ok DATABASE`, or `error SQLSTATE MESSAGE` when the driver refuses; exits 0 either way.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;

public class ConnectFrom {
    public static void main(String[] args) {
        try (Connection conn = DriverManager.getConnection(args[0]);
             ResultSet rs = conn.createStatement().executeQuery("select current_database()")) {
            rs.next();
            System.out.println("ok " + rs.getString(1));
        } catch (SQLException e) {
            System.out.println("error " + e.getSQLState() + " " + e.getMessage().replace('\n', ' '));
        }
    }
}
