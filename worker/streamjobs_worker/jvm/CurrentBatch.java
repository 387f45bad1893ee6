package streamjobs.jvm;

import java.io.FileInputStream;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.FieldVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowStreamReader;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.ArrowUtils;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ArrowColumnVector;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A relation whose rows are whatever batch its slot holds when a query over it runs.
 *
 * A stage plans its query once over such relations and collects the same planned query per batch after
 * loading the batch's tables into the slots: analysis, optimization and physical planning are paid once per
 * query and input schema instead of per batch. The slot keeps the batch as Arrow vectors (zero copy for the
 * scan) until the next load or free.
 */
public final class CurrentBatch implements TableProvider {
    private static final Map<String, Loaded> SLOTS = new ConcurrentHashMap<>();

    /** The Arrow IPC stream at path (one schema, the slot's) becomes the slot's batch; the previous is freed. */
    public static void load(String slot, String path) throws IOException {
        BufferAllocator allocator = ArrowUtils.rootAllocator().newChildAllocator("slot " + slot, 0, Long.MAX_VALUE);
        try (FileInputStream in = new FileInputStream(path)) {
            ArrowStreamReader reader = new ArrowStreamReader(in, allocator);
            VectorSchemaRoot root = reader.getVectorSchemaRoot();
            List<ColumnarBatch> batches = new ArrayList<>();
            while (reader.loadNextBatch()) {
                VectorSchemaRoot copy = VectorSchemaRoot.create(root.getSchema(), allocator);
                for (int i = 0; i < root.getFieldVectors().size(); i++) {
                    root.getVector(i).makeTransferPair(copy.getVector(i)).transfer();
                }
                copy.setRowCount(root.getRowCount());
                ColumnVector[] columns = new ColumnVector[copy.getFieldVectors().size()];
                for (int i = 0; i < columns.length; i++) {
                    columns[i] = new KeptColumn((FieldVector) copy.getVector(i));
                }
                batches.add(new ColumnarBatch(columns, copy.getRowCount()));
            }
            reader.close();
            Loaded previous = SLOTS.put(slot, new Loaded(allocator, batches));
            if (previous != null) {
                previous.free();
            }
        } catch (IOException | RuntimeException e) {
            allocator.close();
            throw e;
        }
    }

    /** Frees the slot's batch: after every run of a query over it (prepared.py), a failed one too. */
    public static void free(String slot) {
        Loaded previous = SLOTS.remove(slot);
        if (previous != null) {
            previous.free();
        }
    }

    public static Set<String> slots() {
        return SLOTS.keySet();
    }

    private record Loaded(BufferAllocator allocator, List<ColumnarBatch> batches) {
        void free() {
            for (ColumnarBatch batch : batches) {
                batch.close();
            }
            allocator.close();
        }
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        throw new IllegalArgumentException("a current-batch relation is read with its schema");
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new SlotTable(properties.get("slot"), schema);
    }

    private record SlotTable(String slot, StructType schema) implements SupportsRead {
        @Override
        public String name() {
            return "current batch " + slot;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return Set.of(TableCapability.BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return () -> new SlotScan(slot, schema);
        }
    }

    record SlotScan(String slot, StructType schema) implements Scan, Batch {
        @Override
        public StructType readSchema() {
            return schema;
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public ColumnarSupportMode columnarSupportMode() {
            return ColumnarSupportMode.SUPPORTED;
        }

        @Override
        public InputPartition[] planInputPartitions() {
            return new InputPartition[] {new SlotPartition(slot)};
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new SlotReaderFactory();
        }
    }

    /** A column Spark reads as often as the query reads its relation: a self-join reads it twice per run, and
     *  every batch's run reads it again. Spark frees a read-only column once it has turned it into rows. */
    private static final class KeptColumn extends ArrowColumnVector {
        KeptColumn(FieldVector vector) {
            super(vector);
        }

        @Override
        public void closeIfFreeable() {}
    }

    private record SlotPartition(String slot) implements InputPartition, Serializable {}

    private static final class SlotReaderFactory implements PartitionReaderFactory {
        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return true;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("a current-batch relation is read as columns");
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            String slot = ((SlotPartition) partition).slot();
            Loaded loaded = SLOTS.get(slot);
            if (loaded == null) {
                throw new IllegalStateException("slot " + slot + " holds no batch");
            }
            Iterator<ColumnarBatch> batches = loaded.batches().iterator();
            return new PartitionReader<>() {
                private ColumnarBatch current;

                @Override
                public boolean next() {
                    current = batches.hasNext() ? batches.next() : null;
                    return current != null;
                }

                @Override
                public ColumnarBatch get() {
                    return current;
                }

                @Override
                public void close() {}
            };
        }
    }
}
