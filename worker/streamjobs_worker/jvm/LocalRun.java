package streamjobs.jvm;

import java.io.BufferedOutputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.spark.Partition;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext$;
import org.apache.spark.TaskContextImpl;
import org.apache.spark.memory.TaskMemoryManager;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.arrow.ArrowBatchStreamWriter;
import org.apache.spark.sql.execution.arrow.ArrowConverters$;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.internal.SQLConf$;
import org.apache.spark.sql.types.StructType;

import scala.Option;
import scala.runtime.BoxedUnit;

/**
 * Runs a query planned over current-batch relations on the calling thread and writes its rows as one Arrow
 * IPC stream, as Spark's collect to Python would send them.
 *
 * Such a plan has no exchange (Reuse) and one partition: a job for it (a stage, its task serialized to the
 * local executor, the result back through a socket, the scheduler's and listeners' events) cost more JVM time
 * than a small batch's rows. Here its partition is computed where the scheduler's task would compute it, in
 * a task context of its own with its own memory, released when it ends.
 */
public final class LocalRun {
    // Task attempt ids apart from the scheduler's, which count up from 0.
    private static final AtomicLong ATTEMPTS = new AtomicLong(1L << 48);

    private LocalRun() {}

    /** Run the query and write its result to path (an Arrow IPC stream: its schema, then its batches). */
    public static void toArrowFile(Dataset<?> query, String path) throws IOException {
        SparkSession session = query.sparkSession();
        SQLConf conf = session.sessionState().conf();
        try {
            session.withActive(() -> SQLConf$.MODULE$.withExistingConf(conf, () -> {
                write(query, conf, path);
                return BoxedUnit.UNIT;
            }));
        } catch (UncheckedIOException e) {
            throw e.getCause();
        }
    }

    /** Bytes of the executor's memory that tasks hold now: none between batches, or a run kept what it took. */
    public static long executionMemoryUsed() {
        return SparkEnv.get().memoryManager().executionMemoryUsed();
    }

    private static void write(Dataset<?> query, SQLConf conf, String path) {
        StructType schema = query.schema();
        String timeZone = conf.sessionLocalTimeZone();
        boolean duplicatesFail = conf.pandasStructHandlingMode().equals("legacy");
        boolean large = conf.arrowUseLargeVarTypes();
        RDD<InternalRow> rows = query.queryExecution().executedPlan().execute();
        Partition[] partitions = rows.partitions();
        try (OutputStream out = new BufferedOutputStream(new FileOutputStream(path), 1 << 16)) {
            ArrowBatchStreamWriter writer = new ArrowBatchStreamWriter(schema, out, timeZone, duplicatesFail, large);
            for (Partition partition : partitions) {
                TaskContextImpl context = newTask(query.sparkSession(), partition, partitions.length);
                runTask(context, () -> writer.writeBatches(ArrowConverters$.MODULE$.toBatchIterator(
                        rows.iterator(partition, context), schema, conf.arrowMaxRecordsPerBatch(), timeZone,
                        duplicatesFail, large, context)));
            }
            writer.end();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private static TaskContextImpl newTask(SparkSession session, Partition partition, int partitions) {
        SparkEnv env = SparkEnv.get();
        long attempt = ATTEMPTS.getAndIncrement();
        Properties properties = new Properties();
        properties.putAll(session.sparkContext().getLocalProperties());
        return new TaskContextImpl(0, 0, partition.index(), attempt, 0, partitions,
                new TaskMemoryManager(env.memoryManager(), attempt), properties, env.metricsSystem(),
                TaskContextImpl.$lessinit$greater$default$10(), TaskContextImpl.$lessinit$greater$default$11(),
                TaskContextImpl.$lessinit$greater$default$12());
    }

    /** What the executor does around a task's work: its context current, its listeners and memory ended. */
    private static void runTask(TaskContextImpl context, Runnable work) {
        TaskContext$.MODULE$.setTaskContext(context);
        Throwable failure = null;
        try {
            work.run();
        } catch (RuntimeException | Error e) {
            failure = e;
            context.markTaskFailed(e);
            throw e;
        } finally {
            try {
                context.markTaskCompleted(Option.apply(failure));
            } catch (RuntimeException | Error e) {
                if (failure == null) {
                    throw e;
                }
                failure.addSuppressed(e);
            } finally {
                SparkEnv.get().blockManager().releaseAllLocksForTask(context.taskAttemptId());
                context.taskMemoryManager().cleanUpAllAllocatedMemory();
                TaskContext$.MODULE$.unset();
            }
        }
    }
}
