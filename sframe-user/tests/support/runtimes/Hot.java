// A Java program spinning in javaOuter -> javaMiddle -> javaLeaf until its main thread's
// CPU time reaches the seconds given (args[0]): the test is budgeted in the workload's
// CPU time. With a second argument it writes its pid to that file first and waits for
// the file to be removed (the test then asks it for its perf map with jcmd).
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.nio.file.Files;
import java.nio.file.Path;

public class Hot {
    static double javaLeaf(int n) {
        double s = 0;
        for (int i = 0; i < n; i++) s += Math.sqrt(i) * 1.0001;
        return s;
    }

    static double javaMiddle(int n) {
        return javaLeaf(n) + 1;
    }

    static double javaOuter(int rounds) {
        double t = 0;
        for (int k = 0; k < rounds; k++) t += javaMiddle(20000);
        return t;
    }

    public static void main(String[] args) throws Exception {
        long budgetNs = (long) (Double.parseDouble(args[0]) * 1e9);
        ThreadMXBean threads = ManagementFactory.getThreadMXBean();
        long start = threads.getCurrentThreadCpuTime();
        double t = 0;
        boolean told = args.length < 2;
        while (threads.getCurrentThreadCpuTime() - start < budgetNs) {
            // Called often: HotSpot compiles it fully (not only on stack) within the first
            // second, before the test asks for its map (a later compile is not in it).
            t += javaOuter(2);
            if (!told && threads.getCurrentThreadCpuTime() - start > budgetNs / 3) {
                Path pidFile = Path.of(args[1]);
                Files.writeString(pidFile, Long.toString(ProcessHandle.current().pid()));
                while (Files.exists(pidFile)) Thread.sleep(10);
                told = true;
            }
        }
        System.out.println(t);
    }
}
